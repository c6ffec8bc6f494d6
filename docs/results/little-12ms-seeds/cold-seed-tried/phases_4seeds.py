"""One cell with conversations, seeds 0..3 summed: each phase's SLO-met requests and the
requests the latency tier served, for the learned policy.

    TG_SEED=16 python docs/results/little-12ms-seeds/cold-seed-tried/phases_4seeds.py CELL"""

import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from phase_totals import summed, tally

from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of

SEEDS = 4


def one(task: tuple[int, tuple[str, ...]]) -> dict[int, list[int]]:
    seed, cell = task
    arm = Arm("learned", "learned", PolicyParams())
    return tally(simulate(spec_of(cell, arm, seed, 20.0, "chat")).done)


def main() -> None:
    cell = tuple(sys.argv[1].split("/"))
    with mp.Pool(2) as pool:
        total = summed(pool.map(one, [(s, cell) for s in range(SEEDS)]))
    print(sys.argv[1], {ph: f"met {t[0]} lat {t[1]}/{t[2]}" for ph, t in sorted(total.items())})


if __name__ == "__main__":
    main()
