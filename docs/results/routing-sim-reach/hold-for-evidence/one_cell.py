"""One cell's learned runs, seed by seed, with the held requests counted and the SLO-met
requests per phase (run from a tree with change.diff applied; HOLD=1 turns the hold on).

Usage: HOLD=1 python one_cell.py DEPLOYMENT/SHAPE/SLO SEED,SEED [WORKLOAD]"""

import collections
import sys

from gateway.routing.params import PolicyParams
from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of

cell = tuple(sys.argv[1].split("/"))
seeds = [int(x) for x in sys.argv[2].split(",")]
workload = sys.argv[3] if len(sys.argv) > 3 else "one-off"
for seed in seeds:
    cosim.HOLDS[0] = 0  # type: ignore[attr-defined]
    arm = Arm("learned", "learned", PolicyParams())
    r = cosim.simulate(spec_of(cell, arm, seed, 20.0, workload))  # type: ignore[arg-type]
    met = collections.Counter(d.phase for d in r.done if d.met and d.phase is not None)
    n = collections.Counter(d.phase for d in r.done if d.phase is not None)
    phases = [f"{met[k]}/{n[k]}" for k in sorted(n)]
    print(seed, "holds", cosim.HOLDS[0], "met", sum(met.values()), phases)  # type: ignore[attr-defined]
