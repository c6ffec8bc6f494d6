"""Calls per stream that affinity adds, from calls.py's four profiles in FOLDER
(on-0.prof, on-400.prof, off-0.prof, off-400.prof): `python compare.py FOLDER`."""

from __future__ import annotations

import pstats
import sys
from pathlib import Path


def calls(path: Path) -> dict[str, int]:
    stats = pstats.Stats(str(path)).stats
    # Built-ins are named by their object's address, which differs between processes: by name.
    return {f"{Path(k[0]).name}:{k[1]}:{k[2].split(' at 0x')[0]}": v[1] for k, v in stats.items()}


def per_stream(folder: Path, mode: str, streams: int) -> dict[str, float]:
    a, b = calls(folder / f"{mode}-{streams}.prof"), calls(folder / f"{mode}-0.prof")
    return {k: (a.get(k, 0) - b.get(k, 0)) / streams for k in a.keys() | b.keys()}


def main(folder: Path, streams: int = 400) -> None:
    on, off = per_stream(folder, "on", streams), per_stream(folder, "off", streams)
    diff = {k: on.get(k, 0.0) - off.get(k, 0.0) for k in on.keys() | off.keys()}
    print("calls per stream, affinity on minus off:")
    for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1])):
        if abs(v) >= 0.05:
            print(f"{v:+8.2f}  {k}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
