"""The cost of one routing decision alone: each policy called in a loop on a fixed snapshot of
a tutorial deployment (1 latency + 2 throughput backends) with 64 requests in flight, the
latency model's curves in it (the priors: a decision reads their tables, whatever the values).

This is the number the routing budget is about (the policy call in the gateway's process). The
co-simulation measures the same call inside a running simulation too, where another process
shares the cores and the caches are cold: both are reported.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from gateway.latency_model import prior_prediction
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

__all__ = ["decision_alone", "snapshot"]

_MODEL = "m"
# 64 in flight: 16 on the latency tier (4 of them with a tighter SLO), 24 on each replica.
_SPREAD = ((Role.LATENCY, 16, ((0.025, 12), (0.012, 4))),
           (Role.THROUGHPUT, 24, ((0.025, 24),)),
           (Role.THROUGHPUT, 24, ((0.025, 24),)))  # fmt: skip


def snapshot(params: PolicyParams, slo: Slo) -> LoadSnapshot:
    backends, loads, curves = [], {}, {}
    for i, (role, n, slos) in enumerate(_SPREAD):
        b = Backend(f"http://backend-{i}:8000", role.value, role, frozenset({_MODEL}))
        backends.append(b)
        loads[b.url] = BackendLoad(running=n, inflight=n, slos=slos)
        curves[b.url] = prior_prediction(role, params, slo)
    return LoadSnapshot(tuple(backends), loads, 0.0, curves)


def _pct(sorted_ns: Sequence[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q / 100))] / 1000


def decision_alone(
    policies: Sequence[str], rounds: int = 5, per_round: int = 20_000
) -> dict[str, Any]:
    """p50/p99 (µs) per policy over rounds x per_round calls; the policies' order rotates per
    round, so neither always runs on a warmer cache."""
    params, slo = PolicyParams(), Slo()
    snap, req = snapshot(params, slo), RouteRequest(_MODEL, stream=True, slo=slo)
    built = {name: build_policy(name, params) for name in policies}
    samples: dict[str, list[int]] = {name: [] for name in policies}
    clock = time.perf_counter_ns
    for r in range(rounds):
        order = list(policies[r % len(policies) :]) + list(policies[: r % len(policies)])
        for name in order:
            policy, rng, state, out = built[name], random.Random(r), RouterState(), samples[name]
            for _ in range(per_round):
                t0 = clock()
                state = policy(req, snap, state, rng).state
                out.append(clock() - t0)
    result: dict[str, Any] = {}
    for name, ns in samples.items():
        ns.sort()
        result[name] = {
            "samples": len(ns),
            "p50_us": _pct(ns, 50),
            "p99_us": _pct(ns, 99),
            "mean_us": statistics.fmean(ns) / 1000,
        }
    return {"inflight": sum(n for _, n, _ in _SPREAD), "rounds": rounds, "policies": result}
