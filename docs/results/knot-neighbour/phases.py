"""One cell of the routing study, per phase: each backend's mean streams, SLO-met requests per
tier, the later turns that stayed home, and the policy's reasons. Policy `learned` or a fixed
latency-tier limit (the oracle's sweep); the learned policy's parameters as JSON after it.
From the repository's root:

    PYTHONPATH=. python docs/results/knot-neighbour/phases.py little burst interactive chat 2,3
    PYTHONPATH=. python docs/results/knot-neighbour/phases.py little burst interactive chat 2 12
    PYTHONPATH=. python docs/results/knot-neighbour/phases.py eagle-worse burst tight chat 5 \
        learned '{"explore_rate": 0}'
"""

import collections
import json
import sys

from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, oracle_arm, spec_of

dep, shape, slo, workload = sys.argv[1:5]
seeds = [int(s) for s in sys.argv[5].split(",")]
policy = sys.argv[6] if len(sys.argv) > 6 else "learned"
params = PolicyParams.model_validate(json.loads(sys.argv[7]) if len(sys.argv) > 7 else {})
for seed in seeds:
    arm = Arm("learned", "learned", params) if policy == "learned" else oracle_arm(int(policy))
    r = simulate(spec_of((dep, shape, slo), arm, seed, 20.0, workload))
    met = sum(d.met for d in r.done if d.phase is not None)
    print(f"seed {seed} met {met} reasons {dict((str(k), v) for k, v in r.reasons.items())}")
    phases: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for d in r.done:
        if d.phase is None:
            continue
        c = phases[d.phase]
        c[d.role + "_n"] += 1
        c[d.role + "_met"] += d.met
        if d.turn:
            c["later"] += 1
            c["stayed"] += d.stayed
    for p in sorted(phases):
        load = {u.split("//")[1].split(".")[0]: round(v, 1) for u, v in r.phase_load[p].items()}
        print(" phase", p, load, dict(sorted(phases[p].items())))
    for url, pts in r.curves.items():
        print(" learned TPOT ms at 1..", len(pts), url, [round(t * 1000, 2) for t, _ in pts][:16])
