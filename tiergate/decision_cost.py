"""The cost of one routing decision alone: each policy called in a loop on a fixed snapshot with
64 requests in flight, with 3 backends (1 latency + 2 throughput, as the tutorial) and with 16
(2 latency + 14 throughput), the latency model's predictions in it (learned from a roofline of
step times up to 32 streams, so the tables hold data, the step past the frontier and the bound
past it, as in the gateway).

This is the number the routing budget is about (the policy call in the gateway's process). The
co-simulation measures the same call inside a running simulation too, where another process
shares the cores and the caches are cold: both are reported.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from gateway.latency_model import BackendModel
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
from gateway.routing.curves import Prediction

__all__ = ["SIZES", "decision_alone", "snapshot"]

_MODEL = "m"
_INFLIGHT = 64
SIZES = (3, 16)  # backends in the snapshot


def _prediction(role: Role) -> Prediction:
    """A model that has seen 1..32 streams of an engine whose step is a roofline."""
    model = BackendModel(memory=16, halflife_s=3.0, spread=0.1, ridge_max=2048)
    speculative = role is Role.LATENCY
    for n in range(1, 33):
        tokens = n * (6 if speculative else 1)
        step = 0.019 + 2e-6 * tokens + 3e-4 * max(0, tokens - 82)
        model.observe_request(0.0, (n, step / (3.26 if speculative else 1.0)), (n, 0.2))
    return model.prediction()


def snapshot(backends: int = 3) -> LoadSnapshot:
    """`backends` backends (an eighth of them, at least one, latency), 64 requests in flight
    spread over them, a quarter of each backend's with a 12 ms SLO and the rest 25 ms."""
    latency = max(1, backends // 8)
    out, loads, curves = [], {}, {}
    models = {role: _prediction(role) for role in Role}
    for i in range(backends):
        role = Role.LATENCY if i < latency else Role.THROUGHPUT
        b = Backend(f"http://backend-{i}:8000", role.value, role, frozenset({_MODEL}))
        n = _INFLIGHT // backends + (i < _INFLIGHT % backends)
        tight = n // 4
        out.append(b)
        loads[b.url] = BackendLoad(running=n, inflight=n, slos=((0.025, n - tight), (0.012, tight)))
        curves[b.url] = models[role]
    return LoadSnapshot(tuple(out), loads, 0.0, curves)


def _pct(sorted_ns: Sequence[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q / 100))] / 1000


def decision_alone(
    policies: Sequence[str], rounds: int = 5, per_round: int = 20_000,
    sizes: Sequence[int] = SIZES,
) -> dict[str, Any]:  # fmt: skip
    """p50/p99 (µs) per policy and snapshot size over rounds x per_round calls; the policies'
    order rotates per round, so neither always runs on a warmer cache."""
    params, slo = PolicyParams(), Slo()
    req = RouteRequest(_MODEL, stream=True, slo=slo)
    built = {name: build_policy(name, params) for name in policies}
    snaps = {size: snapshot(size) for size in sizes}
    samples: dict[tuple[str, int], list[int]] = {(p, s): [] for p in policies for s in sizes}
    clock = time.perf_counter_ns
    # As the gateway does once started (gateway.server.run_server): what lives for the whole
    # run is kept out of the collector's passes.
    gc.collect()
    gc.freeze()
    for r in range(rounds):
        order = list(policies[r % len(policies) :]) + list(policies[: r % len(policies)])
        for size, snap in snaps.items():
            for name in order:
                policy, rng, state = built[name], random.Random(r), RouterState()
                out = samples[(name, size)]
                for _ in range(per_round):
                    t0 = clock()
                    state = policy(req, snap, state, rng).state
                    out.append(clock() - t0)
    result: dict[str, Any] = {}
    for (name, size), ns in samples.items():
        ns.sort()
        result.setdefault(name, {})[str(size)] = {
            "samples": len(ns),
            "p50_us": _pct(ns, 50),
            "p99_us": _pct(ns, 99),
            "mean_us": statistics.fmean(ns) / 1000,
        }
    return {"inflight": _INFLIGHT, "rounds": rounds, "sizes": list(sizes), "policies": result}
