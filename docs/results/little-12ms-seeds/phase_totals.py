"""The A100 `little` 12 ms cell with conversations, 16 seeds: each phase's SLO-met requests and
the requests the latency tier served, summed over the seeds, for the learned policy and the
fixed latency-tier limit of 8.

    python docs/results/little-12ms-seeds/phase_totals.py {burst|step}"""

import multiprocessing as mp
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import Done, simulate
from loadtests.routing_sim.study import Arm, oracle_arm, spec_of

SEEDS = 16
ARMS = ("learned", "8")
Task = tuple[int, str, str]


def tally(done: Iterable[Done]) -> dict[int, list[int]]:
    """Per phase: [SLO-met, served by the latency tier, finished] of a run's requests."""
    per: dict[int, list[int]] = {}
    for d in done:
        if d.phase is not None:
            x = per.setdefault(d.phase, [0, 0, 0])
            x[0] += d.met
            x[1] += d.role.value == "latency"
            x[2] += 1
    return per


def summed(runs: Iterable[dict[int, list[int]]]) -> dict[int, list[int]]:
    """`tally`s of several runs added up, phase by phase."""
    total: dict[int, list[int]] = {}
    for per in runs:
        for ph, x in per.items():
            t = total.setdefault(ph, [0, 0, 0])
            for i in range(3):
                t[i] += x[i]
    return total


def one(task: Task) -> tuple[Task, dict[int, list[int]]]:
    seed, arm, shape = task
    a = Arm("learned", "learned", PolicyParams()) if arm == "learned" else oracle_arm(int(arm))
    return task, tally(simulate(spec_of(("little", shape, "interactive"), a, seed, 20.0,
                                        "chat")).done)


def main() -> None:
    shape = sys.argv[1]
    tasks = [(s, a, shape) for s in range(SEEDS) for a in ARMS]
    with mp.Pool(2) as pool:
        got = dict(pool.map(one, tasks))
    print(f"little/{shape}/interactive chat, seeds 0..{SEEDS - 1}, summed over the seeds")
    for arm in ARMS:
        total = summed(got[(s, arm, shape)] for s in range(SEEDS))
        print(f"  {arm:>7}: " + "; ".join(
            f"phase {ph} SLO-met {t[0]}, latency tier {t[1]} of {t[2]}"
            for ph, t in sorted(total.items())))


if __name__ == "__main__":
    main()
