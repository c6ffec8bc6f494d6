"""Two outputs of learned_only.py side by side, cell by cell: SLO-met requests, the share of
the oracle's and the verdict in each, the difference with its counting noise (2 sqrt(a + b)),
and the seeds' counts.

Usage: python compare.py BEFORE.txt AFTER.txt"""

import re
import sys

LINE = re.compile(
    r"(\S+)\s+before\s+(\d+).*after\s+(\d+) \((\S+) (\S+)\s*\).*oracle (\d+) seeds (\[.*\])"
)


def load(path: str) -> dict[str, tuple[int, int, str, str]]:
    cells = {}
    with open(path) as f:
        for line in f:
            if m := LINE.match(line):
                cells[m[1]] = (int(m[3]), int(m[6]), m[7], m[5])
    return cells


before, after = load(sys.argv[1]), load(sys.argv[2])
total_a = total_b = 0
for cell, (a, oracle, seeds_a, verdict_a) in before.items():
    b, _, seeds_b, verdict_b = after[cell]
    total_a, total_b = total_a + a, total_b + b
    print(f"{cell:30s} {a:6d} {a / oracle:.3f} {verdict_a:5s} -> {b:6d} {b / oracle:.3f} "
          f"{verdict_b:5s} {b - a:+5d} ±{2 * (a + b) ** 0.5:4.0f} {seeds_a} {seeds_b}")  # fmt: skip
print("total", total_a, total_b, f"{total_b / total_a:.4f}")
