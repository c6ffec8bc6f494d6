"""The learned models of every backend after one run (the learned policy, TIERGATE_COMPILED=0):
each engine's request TPOTs and curve observations, and each model's TPOT table, knots and spread.

    python docs/results/little-12ms-seeds/models.py SEED WORKLOAD DEPLOYMENT/SHAPE/SLO"""

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import gateway.backends.latency_model as LM
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

req = collections.defaultdict(list)
eng = collections.defaultdict(list)
o_req = LM.BackendModel.observe_request


def p_req(self, at, tpot, ttft, since=None):
    if tpot is not None:
        req[id(self)].append((round(tpot[0], 1), tpot[1]))
    return o_req(self, at, tpot, ttft, since)


LM.BackendModel.observe_request = p_req
o_obs = LM.CurveLearner.observe


def p_obs(self, n, y, weight=1.0):
    eng[id(self)].append((n, y))
    return o_obs(self, n, y, weight)


LM.CurveLearner.observe = p_obs
allm = []
o_init0 = LM.BackendModel.__init__


def p_init(self, *a, **k):
    o_init0(self, *a, **k)
    allm.append(self)


LM.BackendModel.__init__ = p_init


def _quantiles(ys: list[float]) -> list[object]:
    return [
        "ms p1/p10/p50/p90/p99",
        *(round(ys[int(len(ys) * f)] * 1e3, 2) for f in (0.01, 0.1, 0.5, 0.9, 0.99)),
    ]


seed, wl = int(sys.argv[1]), sys.argv[2]
cell = tuple(sys.argv[3].split("/"))
spec = spec_of(cell, Arm("learned", "learned", PolicyParams()), seed, 20.0, wl)
r = simulate(spec)
print("met", sum(d.met for d in r.done if d.phase is not None))
for k, v in req.items():
    ys = sorted(y for _, y in v)
    print("model", k % 10000, "request TPOTs", len(v), *_quantiles(ys))
print("curve learners:")
for k, v in eng.items():
    ys = sorted(y for _, y in v)
    if not ys or ys[len(ys) // 2] > 0.05:
        continue
    print("learner", k % 10000, len(v), *_quantiles(ys), "n max", max(n for n, _ in v))

for m in allm:
    pr = m.prediction()
    print(
        "model frontier",
        m.frontier,
        "tps",
        m.tps,
        "table",
        [round(pr.tpot.at(n) * 1e3, 2) for n in (1, 4, 8, 16, 32)],
        "bias",
        round(pr.bias, 3),
        "spread",
        round(pr.spread, 3),
    )
    print(
        "   knots",
        [
            (k, round(v * 1e3, 2), round(s, 1))
            for k, v, s in zip(LM.KNOTS, m.tpot.values, m.tpot.seen, strict=True)
            if s > 0
        ],
    )
    print(
        "   spread obj",
        {k: getattr(m.spread, k) for k in m.spread.__slots__}
        if hasattr(m.spread, "__slots__")
        else vars(m.spread),
    )
