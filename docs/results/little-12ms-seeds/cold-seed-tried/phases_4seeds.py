"""One cell with conversations, seeds 0..3 summed: each phase's SLO-met requests and the
requests the latency tier served, for the learned policy.

    TG_SEED=16 python docs/results/little-12ms-seeds/cold-seed-tried/phases_4seeds.py CELL"""

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of


def one(t):
    seed, cell = t
    r = simulate(spec_of(cell, Arm("learned", "learned", PolicyParams()), seed, 20.0, "chat"))
    per = {}
    for d in r.done:
        if d.phase is not None:
            x = per.setdefault(d.phase, [0, 0, 0])
            x[0] += d.met
            x[1] += d.role.value == "latency"
            x[2] += 1
    return t, per
cell = tuple(sys.argv[1].split("/"))
tasks = [(s, cell) for s in range(4)]
with mp.Pool(2) as p:
    res = dict(p.map(one, tasks))
tot = {}
for s in range(4):
    for ph, x in res[(s, cell)].items():
        t = tot.setdefault(ph, [0, 0, 0])
        for i in range(3):
            t[i] += x[i]
print(sys.argv[1], {ph: f"met {t[0]} lat {t[1]}/{t[2]}" for ph, t in sorted(tot.items())})
