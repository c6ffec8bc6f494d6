"""What moved the latency engine's knots between 4 and 8 streams in one run of the learned
policy (A100 `little` burst 12 ms with conversations): (engine reading or finished stream, the
streams, the step it stands for in ms (TPOT x tokens a step), for an engine reading (prompt
tokens a step, the raw step ms, the price in µs a token), the tokens a step).

    python docs/results/little-12ms-seeds/knot6.py SEED"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import gateway.backends.latency_model as LM
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

ctx = {}
o_w = LM.PrefillCost.without


def p_w(self, per_step, step_s):
    r = o_w(self, per_step, step_s)
    ctx["w"] = (round(per_step, 1), round(step_s * 1e3, 2), round(self.per_token * 1e6, 1))
    return r


LM.PrefillCost.without = p_w
o_e = LM.BackendModel.observe_engine


def p_e(self, sample, now):
    ctx["src"] = "eng"
    ctx["w"] = None
    ctx["m"] = self
    r = o_e(self, sample, now)
    ctx["src"] = None
    return r


o_r = LM.BackendModel.observe_request


def p_r(self, at, tpot, ttft, since=None):
    ctx["src"] = "req"
    ctx["w"] = None
    ctx["m"] = self
    r = o_r(self, at, tpot, ttft, since)
    ctx["src"] = None
    return r


LM.BackendModel.observe_engine = p_e
LM.BackendModel.observe_request = p_r
o_o = LM.CurveLearner.observe
rows = []


def p_o(self, n, y, weight=1.0):
    m = ctx.get("m")
    if ctx.get("src") and m is not None and m.tpot is self and m.tps is not None and 4 < n < 8:
        rows.append(
            (ctx["src"], round(n, 1), round(y * 1e3 * m.tps, 2), ctx.get("w"), round(m.tps, 3))
        )
    return o_o(self, n, y, weight)


LM.CurveLearner.observe = p_o
simulate(
    spec_of(
        ("little", "burst", "interactive"),
        Arm("learned", "learned", PolicyParams()),
        int(sys.argv[1]),
        20.0,
        "chat",
    )
)
for r in rows[:40]:
    print(r)
print(len(rows))
