"""One cell of the routing study, per phase, with the learned policy under given parameters:
the SLO-met requests, the policy's reasons, each backend's mean streams and the requests and
SLO-met requests per tier. From the repository's root:

    PYTHONPATH=. TIERGATE_COMPILED=0 python docs/results/stakes-past-frontier/phases.py \
        eagle-worse burst tight chat 5 '{"explore_rate": 0}'
"""

import collections
import json
import sys

from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

dep, shape, slo, workload = sys.argv[1:5]
seeds = [int(s) for s in sys.argv[5].split(",")]
params = PolicyParams.model_validate(json.loads(sys.argv[6]) if len(sys.argv) > 6 else {})
for seed in seeds:
    arm = Arm("learned", "learned", params)
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
