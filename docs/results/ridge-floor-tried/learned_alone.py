"""The learned policy alone over the cells of a stored `bench routing-sim` study, seeds 0..k-1,
against the learned policy's counts of the same seeds at the current code as
docs/results/prefill-steps stored them (its `after` column), with the oracle from the study.
Each row: cell, before (of the oracle) -> after (of the oracle), the difference, the noise band
2 sqrt(a + b), the per-seed counts before and after.

    python docs/results/ridge-floor-tried/learned_alone.py STUDY SEEDS [CELL,...] [PARAMS]

STUDY: oneoff-a100, chat-a100, oneoff-h200 or chat-h200. PARAMS: policy parameters as JSON."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

RESULTS = Path(__file__).resolve().parents[1]
Cell = tuple[str, str, str]


def one(task: tuple[Cell, int, str, str]) -> tuple[Cell, int, int]:
    cell, seed, workload, params = task
    arm = Arm("learned", "learned", PolicyParams.model_validate(json.loads(params)))
    r = simulate(spec_of(cell, arm, seed, 20.0, workload))
    return cell, seed, sum(d.met for d in r.done if d.phase is not None)


def main() -> None:
    study, k = sys.argv[1], int(sys.argv[2])
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 and sys.argv[3] else None
    params = sys.argv[4] if len(sys.argv) > 4 else "{}"
    workload = "chat" if study.startswith("chat") else "one-off"
    report = json.loads((RESULTS / "routing-sim-prefill" / study / "routing-sim.json").read_text())
    base: dict[tuple[str, ...], list[int]] = {}
    for line in (RESULTS / "prefill-steps" / f"{study}.txt").read_text().splitlines():
        m = re.match(r"(\S+)\s+before.*seeds \[([^\]]*)\]", line)
        if m:
            base[tuple(m.group(1).split("/"))] = [int(x) for x in m.group(2).split(",")]
    cells = [c for c in report["cells"]
             if not only or f"{c['deployment']}/{c['shape']}/{c['slo']}" in only]  # fmt: skip
    tasks = [((c["deployment"], c["shape"], c["slo"]), s, workload, params) for c in cells
             for s in range(k)]  # fmt: skip
    got: dict[Cell, dict[int, int]] = {}
    with mp.Pool(2) as pool:
        for cell, seed, met in pool.imap_unordered(one, tasks):
            got.setdefault(cell, {})[seed] = met
    totals = [0, 0]
    for c in cells:
        cell = (c["deployment"], c["shape"], c["slo"])
        before = base[cell][:k]
        after = [got[cell][s] for s in range(len(before))]
        oracle = max(sum(v["per_seed"][: len(before)]) for v in c["sweep"].values())
        a, b = sum(before), sum(after)
        totals[0] += a
        totals[1] += b
        print(f"{'/'.join(cell):30s} {a:6d} ({a / oracle:.3f}) -> {b:6d} ({b / oracle:.3f}) "
              f"{b - a:+5d} ±{2 * math.sqrt(a + b):4.0f} {before} {after}", flush=True)  # fmt: skip
    print(f"total {totals[0]} -> {totals[1]} ({totals[1] / totals[0]:.4f})")


if __name__ == "__main__":
    main()
