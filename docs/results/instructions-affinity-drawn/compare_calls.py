"""Calls to C functions in two callgrind dumps, and the largest differences, per request:
`python compare_calls.py A.out.1 B.out.1 REGEX [REQUESTS]` (REGEX: the functions listed
first)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent / "instructions-affinity-setting" / "repeats"
           / "bench-windows"),
)  # fmt: skip
from calls import calls


def main(a: str, b: str, pattern: str, requests: int) -> None:
    ca, cb = calls(a), calls(b)
    names = sorted(ca.keys() | cb.keys())
    print(f"calls per request, first against second ({requests} requests):")
    for k in (k for k in names if re.search(pattern, k)):
        print(f"{ca[k] / requests:10.2f} {cb[k] / requests:10.2f}  {k[:90]}")
    print("largest differences:")
    for k in sorted(names, key=lambda k: -abs(ca[k] - cb[k]))[:20]:
        print(f"{(ca[k] - cb[k]) / requests:+10.2f}  {k[:90]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 200)
