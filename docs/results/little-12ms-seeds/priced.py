"""Every engine reading of one run of the learned policy (A100 `little` burst 12 ms with
conversations) whose step was over 30 ms or, its prefill taken out at the learned price, under
12.5 ms: (the prefill model, prompt tokens a step, the raw step ms, the price in µs a token,
the step less its prefill ms).

    python docs/results/little-12ms-seeds/priced.py SEED"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import gateway.backends.latency_model as LM
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

log = []
o_w = LM.PrefillCost.without


def p_w(self, per_step, step_s):
    r = o_w(self, per_step, step_s)
    log.append(
        (
            id(self) % 10000,
            round(per_step, 1),
            round(step_s * 1e3, 2),
            round(self.per_token * 1e6, 3),
            round(r * 1e3, 2),
        )
    )
    return r


LM.PrefillCost.without = p_w
spec = spec_of(
    ("little", "burst", "interactive"),
    Arm("learned", "learned", PolicyParams()),
    int(sys.argv[1]),
    20.0,
    "chat",
)
simulate(spec)
print("prefill-model, prompt tokens/step, raw step ms, per-token us, step less prefill ms")
for row in log:
    if row[2] > 30 or row[4] < 12.5:
        print(row)
print(len(log), "readings")
