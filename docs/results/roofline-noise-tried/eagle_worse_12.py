"""The learned policy in `eagle-worse` burst 4 ms with conversations, 12 seeds, with exploring
and without: each arm's SLO-met requests, per seed, and the ratio (what exploring costs).

    python docs/results/roofline-noise-tried/eagle_worse_12.py"""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ridge-floor-tried"))
from learned_alone import one

CELL = ("eagle-worse", "burst", "tight")
ARMS = ("{}", '{"explore_rate": 0}')  # exploring, not
SEEDS = 12

if __name__ == "__main__":
    tasks = [(CELL, s, "chat", arm) for arm in ARMS for s in range(SEEDS)]
    with mp.Pool(2) as pool:
        met = [m for _, _, m in pool.map(one, tasks)]  # in the tasks' order
    got = {arm: met[i * SEEDS : (i + 1) * SEEDS] for i, arm in enumerate(ARMS)}
    for arm, v in got.items():
        print(arm, sum(v), v)
    print(f"exploring / not: {sum(got[ARMS[0]]) / sum(got[ARMS[1]]):.3f}")
