"""The learned policy's SLO-met requests per cell in two `tiergate bench routing-sim` reports
of the same cells, over the seeds both ran, as a markdown table, unfavourable first.

    python docs/results/routing-sim-reach/compare.py BEFORE.json AFTER.json

Where one report ran more seeds than the other (seeds are numbered from 0 in both), only the
first ones both ran count, and each cell's oracle is found again over those seeds: the best
fixed limit of the sweep by its count over them. Noise: the study's band for two counts a, b,
2 sqrt(a + b); a verdict against 95% of the oracle as the study gives it (MET; within noise:
short of it by less than the band between the count and the oracle's; NOT MET). Seeds lower /
higher: seeds whose count fell / rose (the same requests and draws on both sides). The other
policies' counts over those seeds must be the same in both (the same simulations): it says so
if not.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

Cell = dict[str, Any]


def cells(path: str) -> dict[tuple[str, str, str], Cell]:
    report = json.load(open(path))  # noqa: SIM115 (read whole at once)
    return {(c["deployment"], c["shape"], c["slo"]): c for c in report["cells"]}


def seeds_of(cell: Cell) -> int:
    return len(cell["policies"]["learned"]["per_seed"])


def verdict(met: int, cell: Cell, k: int) -> tuple[float, str]:
    """Learned's share of the oracle over the first `k` seeds, and its verdict."""
    oracle = max(sum(run["per_seed"][:k]) for run in cell["sweep"].values())
    if not oracle:
        return math.inf, "MET"
    noise = 2 * math.sqrt(met + oracle)
    target = 0.95 * oracle
    text = "MET" if met >= target else "within noise" if met >= target - noise else "NOT MET"
    return met / oracle, text


def main() -> None:
    before, after = cells(sys.argv[1]), cells(sys.argv[2])
    rows, same = [], True
    counts: dict[str, dict[str, int]] = {"before": {}, "after": {}}
    for key in sorted(before.keys() & after.keys()):
        a, b = before[key], after[key]
        k = min(seeds_of(a), seeds_of(b))
        for name, p in a["policies"].items():
            theirs = b["policies"][name]["per_seed"][:k]
            same = same and (name == "learned" or p["per_seed"][:k] == theirs)
        x, y = a["policies"]["learned"]["per_seed"][:k], b["policies"]["learned"]["per_seed"][:k]
        was, now = verdict(sum(x), a, k), verdict(sum(y), b, k)
        for side, (_, text) in (("before", was), ("after", now)):
            counts[side][text] = counts[side].get(text, 0) + 1
        ratio = sum(y) / sum(x) if sum(x) else math.inf
        rows.append((ratio, key, k, x, y, was, now))
    print(
        "| cell | seeds | before | after | after / before | noise | seeds lower / higher "
        "| of the oracle | verdict (was) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for ratio, key, k, x, y, was, now in sorted(rows, key=lambda r: (r[0], r[1])):
        lower = sum(n < o for o, n in zip(x, y, strict=True))
        higher = sum(n > o for o, n in zip(x, y, strict=True))
        print(
            f"| {' / '.join(key)} | {k} | {sum(x)} | {sum(y)} | {ratio:.3f} | "
            f"±{2 * math.sqrt(sum(x) + sum(y)):.0f} | {lower} / {higher} | "
            f"{was[0]:.3f} -> {now[0]:.3f} | {now[1]} ({was[1]}) |"
        )
    print()
    for side, c in counts.items():
        print(
            f"- {side}: "
            + ", ".join(f"{v} {c.get(v, 0)}" for v in ("MET", "within noise", "NOT MET"))
            + f" of {len(rows)}"
        )
    if not same:
        print("- the other policies' counts differ: these are not the same simulations")


if __name__ == "__main__":
    main()
