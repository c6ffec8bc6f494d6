"""The learned policy's SLO-met requests per cell in two `tiergate bench routing-sim` reports
of the same cells and seeds, as a markdown table, unfavourable first.

    python docs/results/routing-sim-prefill/compare.py BEFORE.json AFTER.json

Noise: the study's band for two counts a, b, 2 sqrt(a + b). Seeds lower / higher: seeds whose
count fell / rose (the same requests and draws on both sides; ties not counted). The other
policies' counts must be the same in both (the same simulations): it says so if not.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def cells(path: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    report = json.load(open(path))  # noqa: SIM115 (read whole at once)
    return {(c["deployment"], c["shape"], c["slo"]): c for c in report["cells"]}


def main() -> None:
    before, after = cells(sys.argv[1]), cells(sys.argv[2])
    rows, same = [], True
    for key in before.keys() & after.keys():
        a, b = before[key], after[key]
        for name, p in a["policies"].items():
            same = same and (name == "learned" or p["met"] == b["policies"][name]["met"])
        x, y = a["policies"]["learned"], b["policies"]["learned"]
        seeds = list(zip(x["per_seed"], y["per_seed"], strict=True))
        rows.append((y["met"] / x["met"] if x["met"] else math.inf, key, a, b, seeds))
    print(
        "| cell | seeds | before | after | after / before | noise | seeds lower / higher "
        "| of the oracle | verdict (was) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for ratio, key, a, b, seeds in sorted(rows, key=lambda r: (r[0], r[1])):
        x, y = a["policies"]["learned"]["met"], b["policies"]["learned"]["met"]
        lower = sum(n < o for o, n in seeds)
        higher = sum(n > o for o, n in seeds)
        print(
            f"| {' / '.join(key)} | {len(seeds)} | {x} | {y} | {ratio:.3f} | "
            f"±{2 * math.sqrt(x + y):.0f} | {lower} / {higher} | "
            f"{a['learned_over_oracle']:.3f} -> {b['learned_over_oracle']:.3f} | "
            f"{b['vs_oracle']['text']} ({a['vs_oracle']['text']}) |"
        )
    counts = {}
    for side, report in (("before", before), ("after", after)):
        verdicts = [c["vs_oracle"]["text"] for c in report.values()]
        counts[side] = {v: verdicts.count(v) for v in ("MET", "within noise", "NOT MET")}
    print()
    for side, c in counts.items():
        print(f"- {side}: " + ", ".join(f"{v} {n}" for v, n in c.items()) + f" of {len(before)}")
    if not same:
        print("- the other policies' counts differ: these are not the same simulations")


if __name__ == "__main__":
    main()
