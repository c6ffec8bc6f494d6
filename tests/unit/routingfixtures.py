"""Backends, loads and snapshots shared by the routing tests (tests/unit/test_routing*.py)."""

from __future__ import annotations

from gateway.routing import (
    Backend,
    BackendLoad,
    Decision,
    LoadSnapshot,
    PolicyParams,
    Role,
    RouterState,
)

MODEL = "llama-2-7b-chat"
OTHER = "mistral-7b"


def lat(i: int = 0, models: frozenset[str] = frozenset({MODEL})) -> Backend:
    return Backend(f"http://eagle-{i}:8000", "eagle3", Role.LATENCY, models)


def thr(i: int, models: frozenset[str] = frozenset({MODEL})) -> Backend:
    return Backend(f"http://awq-{i}:8000", "awq", Role.THROUGHPUT, models)


L0, L1 = lat(0), lat(1)
T0, T1, T2, T3, T4 = (thr(i) for i in range(5))
T_OTHER = thr(9, frozenset({OTHER}))


def load(
    running: int = 0,
    waiting: int = 0,
    *,
    inflight: int = 0,
    healthy: bool = True,
    stale: bool = False,
) -> BackendLoad:
    return BackendLoad(
        running=running,
        waiting=waiting,
        kv_usage=0.0,
        inflight=inflight,
        healthy=healthy,
        stale=stale,
    )


def snap(*pairs: tuple[Backend, BackendLoad | None]) -> LoadSnapshot:
    """Backends in configuration order; None leaves the backend out of the loads map."""
    return LoadSnapshot(
        backends=tuple(b for b, _ in pairs),
        loads={b.url: ld for b, ld in pairs if ld is not None},
        taken_at=1000.0,
    )


def urls(d: Decision) -> list[str]:
    return [b.url for b in d.candidates]


def names(*backends: Backend) -> list[str]:
    return [b.url for b in backends]


OPEN = RouterState(latency_open=True)
CLOSED = RouterState(latency_open=False)
P = PolicyParams()  # cap 16, hysteresis 2, hard cap 24, max_waiting 8, p2c from 4

# Throughput pool of three (below p2c_min_pool), loads 3/1/2 so order is T1, T2, T0.
POOL = ((T0, load(3)), (T1, load(1)), (T2, load(2)))
SATURATED_POOL = ((T0, load(1, 9)), (T1, load(2, 10)), (T2, load(1, 12)))  # loads 10 < 12 < 13
