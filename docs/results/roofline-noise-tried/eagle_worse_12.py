"""The learned policy in `eagle-worse` burst 4 ms with conversations, 12 seeds, with exploring
and without: each arm's SLO-met requests, per seed, and the ratio (what exploring costs).

    python docs/results/roofline-noise-tried/eagle_worse_12.py"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

cell = ("eagle-worse", "burst", "tight")


def one(task):
    seed, params = task
    arm = Arm("learned", "learned", PolicyParams.model_validate(json.loads(params)))
    r = simulate(spec_of(cell, arm, seed, 20.0, "chat"))
    return params, seed, sum(d.met for d in r.done if d.phase is not None)


if __name__ == "__main__":
    tasks = [(s, p) for p in ("{}", '{"explore_rate": 0}') for s in range(12)]
    got = {}
    with mp.Pool(2) as pool:
        for p, s, m in pool.imap_unordered(one, tasks):
            got.setdefault(p, {})[s] = m
    for p in got:
        v = [got[p][s] for s in range(12)]
        print(p, sum(v), v)
    a, b = sum(got["{}"].values()), sum(got['{"explore_rate": 0}'].values())
    print("exploring / not: %.3f" % (a / b))
