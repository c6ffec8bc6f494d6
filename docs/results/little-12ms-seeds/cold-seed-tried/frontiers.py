"""The most streams each backend had been seen at (its frontier) 20 and 25 virtual seconds into
`tutorial` burst 25 ms with conversations, seeds 0 and 1, the learned policy: when the first
64-user burst comes, and 5 s into it (the routing from its sources).

    TIERGATE_COMPILED=0 TG_SEED=16 python \
        docs/results/little-12ms-seeds/cold-seed-tried/frontiers.py"""

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import gateway.backends.latency_model as LM
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

seen = collections.defaultdict(list)
o = LM.BackendModel.prediction


def p(self):
    r = o(self)
    seen[id(self)].append((self.observed_at or 0.0, self.frontier))
    return r


LM.BackendModel.prediction = p
for seed in range(2):
    seen.clear()
    arm = Arm("learned", "learned", PolicyParams())
    r = simulate(spec_of(("tutorial", "burst", "standard"), arm, seed, 20.0, "chat"))

    def at(s: float) -> list[int]:
        return sorted(max((f for t, f in v if t <= s), default=0) for v in seen.values())

    met = sum(d.met for d in r.done if d.phase is not None)
    print("seed", seed, "SLO-met", met, "frontiers at 20 s:", at(20.0), "at 25 s:", at(25.0))
