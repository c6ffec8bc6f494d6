"""The time of one decision of the learned policy on an overloaded snapshot (a 4 ms class; one
AWQ engine of two holding a pile of 48 streams, the other at its edge, an EAGLE engine at its
own), the predictions remembering their outlooks as between two refits, in the tree on
PYTHONPATH: 5 rounds of 20,000 decisions, each round's p50 and p99 (µs).

    PYTHONPATH=. python docs/results/overflow-drain/drain_cost.py LABEL"""

from __future__ import annotations

import gc
import random
import sys
import time

from gateway.routing import (
    Backend,
    BackendLoad,
    LoadSnapshot,
    PolicyParams,
    Role,
    RouteRequest,
    RouterState,
    Slo,
    build_policy,
)
from gateway.routing.curves import TABLE_MAX, Curve, Prediction


def rising(base: float, per_stream: float) -> Prediction:
    return Prediction(tpot=Curve.of(lambda n: base + per_stream * n),
                      ttft=Curve.of(lambda n: 0.05), observed_at=0.0, frontier=TABLE_MAX,
                      spread=0.02)  # fmt: skip


def backend(name: str, role: Role) -> Backend:
    return Backend(f"http://{name}:8000", role.value, role, frozenset({"m"}))


def main() -> None:
    label = sys.argv[1]
    l0, t0, t1 = backend("l0", Role.LATENCY), backend("t0", Role.THROUGHPUT), backend(
        "t1", Role.THROUGHPUT)  # fmt: skip

    def load(n: int) -> BackendLoad:
        return BackendLoad(running=n, inflight=n, slos=((0.004, n),))

    awq = rising(0.00343, 0.000024)
    snap = LoadSnapshot((l0, t0, t1), {l0.url: load(4), t0.url: load(48), t1.url: load(23)},
                        0.0, {l0.url: rising(0.00355, 0.0001), t0.url: awq,
                              t1.url: rising(0.00343, 0.000024)}, distinct=True)  # fmt: skip
    policy = build_policy("learned", PolicyParams(explore_rate=0))
    req = RouteRequest("m", stream=True, slo=Slo(tpot_s=0.004))
    rng, state = random.Random(0), RouterState()
    first = policy(req, snap, state, rng)
    print(label, first.reason, first.candidates[0].url)
    gc.freeze()
    clock = time.perf_counter_ns
    rounds = []
    for _ in range(5):
        ns = []
        for _ in range(20000):
            t = clock()
            policy(req, snap, state, rng)
            ns.append(clock() - t)
        ns.sort()
        rounds.append((ns[len(ns) // 2] / 1000, ns[int(len(ns) * 0.99)] / 1000))
    print(label, "p50 per round", [round(a, 2) for a, _ in rounds],
          "p99 per round", [round(b, 2) for _, b in rounds])  # fmt: skip


if __name__ == "__main__":
    main()
