"""What each engine's latency model learned as its cost per prompt token over one seed (0) of a
study cell, the learned policy alone: one line per engine, in the order the cell lists them,
then how many scrape intervals it learned from. PYTHONPATH at the checkout to measure.

Usage: python prefill_cost.py DEPLOYMENT/SHAPE/SLO WORKLOAD"""

import sys

import gateway.backends.latency_model as lm
from gateway.routing.params import PolicyParams
from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of

learned: list[tuple[float, float, float]] = []
made: list[lm.PrefillCost] = []
_learn, _init = lm.PrefillCost.learn, lm.PrefillCost.__init__


def learn(self: lm.PrefillCost, n: float, per_step: float, step_s: float) -> None:
    learned.append((n, per_step, step_s))
    _learn(self, n, per_step, step_s)


def init(self: lm.PrefillCost, memory: float) -> None:
    made.append(self)
    _init(self, memory)


lm.PrefillCost.learn, lm.PrefillCost.__init__ = learn, init  # type: ignore[method-assign]
cell = tuple(sys.argv[1].split("/"))
r = cosim.simulate(spec_of(cell, Arm("learned", "learned", PolicyParams()), 0, 20.0, sys.argv[2]))
print("met", sum(d.met for d in r.done if d.phase is not None))
for p in made:
    print("per_token", p.per_token)
print(len(learned), "intervals; per_step nonzero", sum(1 for x in learned if x[1] > 0))
