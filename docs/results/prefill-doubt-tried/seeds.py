"""The learned policy alone in some cells of `bench routing-sim`, seeds FROM..TO-1: each cell's
SLO-met requests per seed and their sum, to set beside another tree's run of the same.

    python docs/results/prefill-doubt-tried/seeds.py {chat|one-off} FROM TO CELL[,CELL...]

CELL: deployment/shape/slo, e.g. little/burst/interactive."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

Cell = tuple[str, str, str]


def one(task: tuple[Cell, int, str]) -> tuple[Cell, int, int]:
    cell, seed, workload = task
    r = simulate(spec_of(cell, Arm("learned", "learned", PolicyParams()), seed, 20.0, workload))
    return cell, seed, sum(d.met for d in r.done if d.phase is not None)


def main() -> None:
    workload, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cells = [tuple(c.split("/")) for c in sys.argv[4].split(",")]
    tasks = [(c, s, workload) for c in cells for s in range(lo, hi)]
    got: dict[Cell, dict[int, int]] = {}
    with mp.Pool(2) as pool:
        for cell, seed, met in pool.imap_unordered(one, tasks):
            got.setdefault(cell, {})[seed] = met
    for c in cells:
        per = [got[c][s] for s in range(lo, hi)]
        print(f"{'/'.join(c):30s} {sum(per):6d} seeds {lo}..{hi - 1} {per}", flush=True)


if __name__ == "__main__":
    main()
