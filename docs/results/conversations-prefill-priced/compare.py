"""Per cell: two trees' counts over the same seeds (learned_only.py's `after` column of each
file), the difference, the noise band (2 sqrt(sum)), each seed's difference, and the verdicts.

Usage: python compare.py BEFORE.txt AFTER.txt"""

import math
import re
import sys
from pathlib import Path

ROW = re.compile(
    r"^(\S+)\s+before\s+\d+ \(.*?\) after\s+(\d+) \(([\d.]+) (\w+)\s*\).*"
    r"oracle (\d+) seeds \[([\d, ]+)\]"
)
Row = tuple[int, str, list[int]]


def read(path: str) -> dict[str, Row]:
    out = {}
    for line in Path(path).read_text().splitlines():
        m = ROW.match(line)
        if m:
            seeds = [int(x) for x in m.group(6).split(",")]
            out[m.group(1)] = (int(m.group(2)), m.group(4), seeds)
    return out


def main() -> None:
    a, b = read(sys.argv[1]), read(sys.argv[2])
    ta = tb = 0
    va: dict[str, int] = {}
    vb: dict[str, int] = {}
    print(f"{'cell':30} {'before':>7} {'after':>7} {'diff':>6} {'band':>5}  per seed  verdict")
    for cell, (x, vx, sx) in a.items():
        y, vy, sy = b[cell]
        ta, tb = ta + x, tb + y
        va[vx] = va.get(vx, 0) + 1
        vb[vy] = vb.get(vy, 0) + 1
        band = 2 * math.sqrt(x + y)
        flag = " beyond" if abs(y - x) > band else ""
        seeds = str([q - p for p, q in zip(sx, sy, strict=True)])
        print(f"{cell:30} {x:7} {y:7} {y - x:+6} {band:5.0f}  {seeds:20} {vx}->{vy}{flag}")
    print(f"total {ta} -> {tb} ({tb / ta:.4f}); verdicts before {va}, after {vb}")


if __name__ == "__main__":
    main()
