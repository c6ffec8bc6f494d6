"""The latency engine's knots, table and chance of its SLO in one cell of the routing study, at
the virtual times asked, with the learned policy (the tree on PYTHONPATH). From the root:

    PYTHONPATH=. python docs/results/prefill-reading-tried/knots.py \
        little burst interactive chat 2 30,90
"""

import sys

import gateway.backends.latency_model as model
import gateway.routing.learned as learned
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

dep, shape, slo, workload, seed = sys.argv[1:6]
times = [float(x) for x in sys.argv[6].split(",")]
state = {"t": 0.0}
decide = learned.Learned.__call__
predict = model.BackendModel.prediction


def call(self, req, snap, st, rng):  # type: ignore[no-untyped-def]
    state["t"] = snap.taken_at
    while times and snap.taken_at >= times[0]:
        t = times.pop(0)
        for url, p in snap.curves.items():
            if "latency" in url:
                print(f"t={t} frontier={p.frontier} spread={p.spread:.3f} bias={p.bias:.3f}"
                      f" tps={p.tokens_per_step:.2f}")  # fmt: skip
                print("  table ms", [round(v * 1000, 2) for v in p.tpot.table[1:13]])
                chances = [learned.met(req.slo.log_tpot, n, p) for n in range(1, 13)]
                print("  p12", [round(c, 2) for c in chances])
    return decide(self, req, snap, st, rng)


def prediction(self):  # type: ignore[no-untyped-def]
    pr = predict(self)
    if times and pr.frontier and pr.acceptance is not None and state["t"] + 0.5 >= times[0]:
        weights = self.tpot.weights
        knots = [(k, round(v * 1000, 2), round(weights[model.KNOTS.index(k)], 1))
                 for k, v in self.tpot.points()]  # fmt: skip
        print("   cost per prompt token, µs (intervals, prefill times)",
              round(self.prefill.per_token * 1e6, 1), round(self.prompt.per_token * 1e6, 1))
        print("   knots", knots[:10])
    return pr


learned.Learned.__call__ = call  # type: ignore[method-assign]
model.BackendModel.prediction = prediction  # type: ignore[method-assign]
simulate(spec_of((dep, shape, slo), Arm("learned", "learned"), int(seed), 20.0, workload))
