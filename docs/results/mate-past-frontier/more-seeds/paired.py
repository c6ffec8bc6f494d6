"""The seeds' counts of two learned_only.py runs of the same cells, side by side: the sums,
their ratio, the counting noise (2 sqrt(a + b)) and how many seeds went each way. (The stored
runs these cells come from hold fewer seeds, so learned_only.py's own "before" and oracle do not
cover them: both sides are run here.)

    python paired.py BEFORE.txt AFTER.txt"""

import ast
import re
import sys

ROW = re.compile(r"^(\S+)\s+before.*seeds (\[.*\])", re.M)


def seeds(path: str) -> dict[str, list[int]]:
    with open(path) as f:
        return {m[1]: ast.literal_eval(m[2]) for m in ROW.finditer(f.read())}


before, after = seeds(sys.argv[1]), seeds(sys.argv[2])
for cell, b in before.items():
    a = after[cell]
    sb, sa = sum(b), sum(a)
    lower = sum(x < y for x, y in zip(a, b, strict=True))
    higher = sum(x > y for x, y in zip(a, b, strict=True))
    print(f"{cell:28s} {sb:6d} -> {sa:6d} ({sa / sb:.3f}) ±{2 * (sa + sb) ** 0.5:.0f} "
          f"seeds lower {lower} higher {higher}  {b} {a}")  # fmt: skip
