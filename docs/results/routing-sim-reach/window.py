"""What outlooks.py and intervals.py share: the window they are asked for, and the learned
policy's run of one seed of a routing-sim cell (the gateway's modules wrapped before it runs)."""

from __future__ import annotations

import sys

from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of


def window() -> tuple[int, str, float, float, str]:
    """SEED CELL FROM_S TO_S [WORKLOAD] from the command line (workload: one-off by default)."""
    seed, cell, start, end = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    return seed, cell, start, end, sys.argv[5] if len(sys.argv) > 5 else "one-off"


def learned_run(seed: int, cell: str, workload: str) -> str:
    """Run the cell (DEPLOYMENT,SHAPE,SLO) with the learned policy; a title for what it shows."""
    deployment, shape, slo = cell.split(",")
    spec = spec_of((deployment, shape, slo), Arm("learned", "learned"), seed, 20.0, workload)
    cosim._Sim(spec).run()
    return f"{deployment} {shape} {slo} ({workload}), seed {seed}"
