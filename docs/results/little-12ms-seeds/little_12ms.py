"""The A100 `little` 12 ms cells with conversations over more seeds: the learned policy alone
against the fixed latency-tier limits that were best in the stored study (8 and 12; 16 and more
fall off a cliff there: docs/results/routing-sim-prefill/chat-a100), seeds 0..k-1.

    python docs/results/little-12ms-seeds/little_12ms.py SEEDS"""

from __future__ import annotations

import math
import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, oracle_arm, spec_of

CELLS = (("little", "step", "interactive"), ("little", "burst", "interactive"))
ARMS = ("learned", "8", "12")


def one(task: tuple[tuple[str, str, str], str, int]) -> tuple[tuple[str, str, str], str, int, int]:
    cell, arm_name, seed = task
    arm = (Arm("learned", "learned", PolicyParams()) if arm_name == "learned"
           else oracle_arm(int(arm_name)))  # fmt: skip
    r = simulate(spec_of(cell, arm, seed, 20.0, "chat"))
    return cell, arm_name, seed, sum(d.met for d in r.done if d.phase is not None)


def main() -> None:
    k = int(sys.argv[1])
    tasks = [(c, a, s) for c in CELLS for a in ARMS for s in range(k)]
    got: dict[tuple[tuple[str, str, str], str], dict[int, int]] = {}
    with mp.Pool(2) as pool:
        for cell, arm, seed, met in pool.imap_unordered(one, tasks):
            got.setdefault((cell, arm), {})[seed] = met
    for cell in CELLS:
        print("/".join(cell), f"chat, seeds 0..{k - 1}")
        per = {a: [got[(cell, a)][s] for s in range(k)] for a in ARMS}
        best = max(("8", "12"), key=lambda a: sum(per[a]))
        for a in ARMS:
            print(f"  {a:>7}: {sum(per[a]):5d}  per seed {per[a]}")
        a, b = sum(per["learned"]), sum(per[best])
        ratios = [x / y for x, y in zip(per["learned"], per[best], strict=True)]
        band = 2 * math.sqrt(a + b) / b
        print(
            f"  learned / best fixed ({best}): {a / b:.3f}x, band +-{band:.3f}"
            f" (2 sqrt(a + b)); per seed {min(ratios):.2f}-{max(ratios):.2f},"
            f" median {sorted(ratios)[len(ratios) // 2]:.2f}"
        )


if __name__ == "__main__":
    main()
