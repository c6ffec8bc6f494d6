"""The learned policy alone over the cells of a stored `bench routing-sim` JSON, seeds 0..k-1,
against that run's counts of the same seeds (the learned policy's and the oracle's sweep): a
change to the learned policy or the affinity stage measured without running the other policies
again (their counts do not depend on it). PARAMS: policy parameters as JSON, e.g.
'{"affinity_yield": 3}'.

Usage: python learned_only.py STUDY.json WORKLOAD SEEDS [CELL,CELL,...|""] [PARAMS]"""

import json
import math
import multiprocessing as mp
import sys
from pathlib import Path

from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

Cell = tuple[str, str, str]
PARAMS = PolicyParams.model_validate(json.loads(sys.argv[5]) if len(sys.argv) > 5 else {})


def one(task: tuple[Cell, int, str]) -> tuple[Cell, int, int]:
    cell, seed, workload = task
    r = simulate(spec_of(cell, Arm("learned", "learned", PARAMS), seed, 20.0, workload))
    return cell, seed, sum(d.met for d in r.done if d.phase is not None)


def verdict(count: int, oracle: int) -> str:
    if count >= 0.95 * oracle:
        return "MET"
    return "noise" if count >= 0.95 * oracle - 2 * math.sqrt(count + oracle) else "NOT"


def main() -> None:
    path, workload, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    only = set(sys.argv[4].split(",")) if len(sys.argv) > 4 and sys.argv[4] else None
    report = json.loads(Path(path).read_text())
    cells = [c for c in report["cells"]
             if not only or f"{c['deployment']}/{c['shape']}/{c['slo']}" in only]  # fmt: skip
    tasks = [((c["deployment"], c["shape"], c["slo"]), s, workload) for c in cells
             for s in range(k)]  # fmt: skip
    got: dict[Cell, dict[int, int]] = {}
    with mp.Pool(2) as pool:
        for cell, seed, met in pool.imap_unordered(one, tasks):
            got.setdefault(cell, {})[seed] = met
    totals = [0, 0]
    counts = {"base": [0, 0, 0], "new": [0, 0, 0]}
    for c in cells:
        cell = (c["deployment"], c["shape"], c["slo"])
        mine = sum(got[cell].values())
        base = sum(c["policies"]["learned"]["per_seed"][:k])
        oracle = max(sum(v["per_seed"][:k]) for v in c["sweep"].values())
        was, now = verdict(base, oracle), verdict(mine, oracle)
        counts["base"][("MET", "noise", "NOT").index(was)] += 1
        counts["new"][("MET", "noise", "NOT").index(now)] += 1
        totals[0] += base
        totals[1] += mine
        band = 2 * math.sqrt(mine + base)
        print(f"{'/'.join(cell):30s} before {base:6d} ({base / oracle:.3f} {was:5s}) after "
              f"{mine:6d} ({mine / oracle:.3f} {now:5s}) {mine - base:+5d} ±{band:4.0f} "
              f"oracle {oracle} seeds {[got[cell][s] for s in range(k)]}", flush=True)
    print(f"total {totals[0]} -> {totals[1]} ({totals[1] / totals[0]:.4f}); MET / within noise /"
          f" NOT MET before {counts['base']}, after {counts['new']}")


if __name__ == "__main__":
    main()
