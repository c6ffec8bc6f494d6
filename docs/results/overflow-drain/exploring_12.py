"""The learned policy in `eagle-worse` (EAGLE slower per token than AWQ at every load), 4 ms,
12 seeds, with exploring and without: each arm's SLO-met requests, per seed, and the ratio
(what exploring costs), for one load shape and workload.

    python docs/results/overflow-drain/exploring_12.py SHAPE WORKLOAD

SHAPE: step or burst; WORKLOAD: chat or one-off. (burst chat is what
docs/results/roofline-noise-tried/eagle_worse_12.py runs.)"""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ridge-floor-tried"))
from learned_alone import one

ARMS = ("{}", '{"explore_rate": 0}')  # exploring, not
SEEDS = 12

if __name__ == "__main__":
    shape, workload = sys.argv[1], sys.argv[2]
    cell = ("eagle-worse", shape, "tight")
    tasks = [(cell, s, workload, arm) for arm in ARMS for s in range(SEEDS)]
    with mp.Pool(2) as pool:
        met = [m for _, _, m in pool.map(one, tasks)]  # in the tasks' order
    got = {arm: met[i * SEEDS : (i + 1) * SEEDS] for i, arm in enumerate(ARMS)}
    print(f"eagle-worse/{shape}/tight, {workload}")
    for arm, v in got.items():
        print(arm, sum(v), v)
    print(f"exploring / not: {sum(got[ARMS[0]]) / sum(got[ARMS[1]]):.3f}")
