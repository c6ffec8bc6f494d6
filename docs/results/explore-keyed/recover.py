"""EAGLE's drafts all rejected from 20 s to 60 s, then accepted again as before (`shift`'s
engines: one v4 latency engine, two v3 pool engines), steady users, the learned policy with its
defaults: SLO-met requests per 20-s phase and the requests the latency engine served, per seed;
the totals per cell. With conversations (`chat`, the routing study's) or one-off prompts.

Usage, from the checkout to measure: PYTHONPATH=. python recover.py SEEDS chat|one-off"""

import multiprocessing as mp
import sys

from gateway.routing.params import PolicyParams
from gateway.routing.types import Role
from loadtests.routing_sim.cosim import RunSpec, simulate
from loadtests.routing_sim.study import CHAT_SYSTEM, CHAT_TURNS, slo_of

V4 = (0.8, 0.75, 0.7, 0.65, 0.6)  # v4's acceptance vector
NONE = (0.0,) * 5
Task = tuple[int, int, str, str]


def one(task: Task) -> tuple[Task, list[int], list[int]]:
    seed, users, slo, workload = task
    chat = workload == "chat"
    spec = RunSpec(("v4",), ("v3", "v3"), (users,) * 6, 20.0, slo_of(slo), "learned",
                   PolicyParams(), seed, ((20.0, NONE), (60.0, V4)),
                   turns=CHAT_TURNS if chat else 1,
                   system_tokens=CHAT_SYSTEM if chat else 0)  # fmt: skip
    met, latency = [0] * 6, [0] * 6
    for d in simulate(spec).done:
        if d.phase is not None:
            met[d.phase] += d.met
            latency[d.phase] += d.role is Role.LATENCY
    return task, met, latency


def main() -> None:
    k, workload = int(sys.argv[1]), sys.argv[2]
    tasks = [(s, u, slo, workload) for u in (4, 16) for slo in ("interactive", "standard")
             for s in range(k)]  # fmt: skip
    with mp.Pool(2) as pool:
        results = sorted(pool.map(one, tasks))
    totals: dict[tuple[int, str], list[int]] = {}
    for (seed, users, slo, w), met, latency in results:
        print(f"{w} users={users:2d} {slo:11s} seed {seed}: met/phase {met} on latency {latency}")
        t = totals.setdefault((users, slo), [0] * 6)
        for i in range(6):
            t[i] += met[i]
    for key, t in totals.items():
        print("TOTAL", key, t, "after recovery:", sum(t[3:]))


if __name__ == "__main__":
    main()
