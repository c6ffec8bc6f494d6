"""Calls to C functions per request in two callgrind dumps (their `calls=` lines summed by
callee), side by side: `python calls.py A B FUNCTION...` (200 requests in each window)."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "relay-inspection"))
from selfcost import Names


def calls(path: str) -> collections.Counter[str]:
    name = Names()
    counted: collections.Counter[str] = collections.Counter()
    callee = ""
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                name(line[3:].strip())
            elif line.startswith("cfn="):
                callee = name(line[4:].strip())
            elif line.startswith("calls="):
                counted[callee] += int(line[6:].split()[0])
    return counted


def main(a: str, b: str, functions: list[str], requests: int = 200) -> None:
    ca, cb = calls(a), calls(b)
    for f in functions:
        print(f"{f:40s} {ca[f] / requests:10.2f} {cb[f] / requests:10.2f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
