"""When a backend, a pool or a decision has no room (gateway.routing.saturation)."""

from __future__ import annotations

import pytest

from gateway.routing import Backend, BackendLoad, LoadSnapshot, Reason, Role, RouteRequest
from gateway.routing.saturation import Saturation
from tests.unit.routingfixtures import L0, L1, MODEL, T0, T1, P, load, snap

LIMITS = Saturation.of(P)  # latency hard cap 24, max_waiting 8

BACKEND: dict[str, tuple[Backend, BackendLoad, Saturation, bool]] = {
    "latency-below-hard-cap": (L0, load(23), LIMITS, False),
    "latency-at-hard-cap": (L0, load(24), LIMITS, True),
    "latency-counts-running-and-waiting": (L0, load(20, 4), LIMITS, True),
    "latency-counts-inflight": (L0, load(2, inflight=24), LIMITS, True),
    "latency-stale-uses-inflight": (L0, load(30, stale=True, inflight=3), LIMITS, False),
    "latency-stale-inflight-at-cap": (L0, load(0, stale=True, inflight=24), LIMITS, True),
    "latency-queue-alone-does-not-matter": (L0, load(0, 9), LIMITS, False),
    "latency-own-cap": (L0, load(5), Saturation(latency_hard_cap=5, max_waiting=8), True),
    "throughput-waiting-at-max": (T0, load(0, 8), LIMITS, False),
    "throughput-waiting-past-max": (T0, load(0, 9), LIMITS, True),
    "throughput-running-alone-never": (T0, load(500, 0, inflight=500), LIMITS, False),
    "throughput-stale-queue-is-old-news": (T0, load(0, 30, stale=True), LIMITS, False),
    "throughput-zero-max-any-queue": (T0, load(0, 1), Saturation(24, max_waiting=0), True),
    "throughput-zero-max-no-queue": (T0, load(40, 0), Saturation(24, max_waiting=0), False),
}


@pytest.mark.parametrize(("b", "bl", "limits", "full"), BACKEND.values(), ids=BACKEND.keys())
def test_backend(b: Backend, bl: BackendLoad, limits: Saturation, full: bool) -> None:
    assert limits.backend(b, bl) is full


POOLS: dict[str, tuple[LoadSnapshot, list[Backend], bool]] = {
    "empty-pool-has-no-room": (snap(), [], True),
    "all-full": (snap((L0, load(24)), (T0, load(0, 9))), [L0, T0], True),
    "one-with-room": (snap((L0, load(24)), (T0, load(0, 9)), (T1, load(3))), [L0, T0, T1], False),
    "unscraped-has-room": (snap((L0, load(24)), (L1, None)), [L0, L1], False),
    "only-the-pool-counts": (snap((L0, load(24)), (T0, load(0))), [L0], True),
}


@pytest.mark.parametrize(("snapshot", "pool", "full"), POOLS.values(), ids=POOLS.keys())
def test_pool(snapshot: LoadSnapshot, pool: list[Backend], full: bool) -> None:
    assert LIMITS.pool(pool, snapshot) is full


# What the admission control sees: the policy's own reason unless the decision is empty, full,
# or pinned (in that order of precedence).
REASONS: dict[str, tuple[list[Backend], Role | None, str]] = {
    "room-keeps-the-policys-reason": ([T1], None, Reason.LATENCY_FULL),
    "nothing-is-no-backend": ([], None, Reason.NO_BACKEND),
    "nothing-pinned-is-no-backend": ([], Role.LATENCY, Reason.NO_BACKEND),
    "all-full-is-saturated": ([L0, T0], None, Reason.SATURATED),
    "all-full-pinned-is-saturated": ([L0], Role.LATENCY, Reason.SATURATED),
    "room-pinned-is-pinned": ([T0, T1], Role.THROUGHPUT, Reason.PINNED),
    "one-with-room-last-is-enough": ([L0, T0, T1], None, Reason.LATENCY_FULL),
}
FULL_BUT_T1 = snap((L0, load(24)), (T0, load(0, 9)), (T1, load(3)))


@pytest.mark.parametrize(("ordered", "pin", "reason"), REASONS.values(), ids=REASONS.keys())
def test_reason(ordered: list[Backend], pin: Role | None, reason: str) -> None:
    req = RouteRequest(MODEL, pinned=pin)
    assert LIMITS.reason(req, ordered, Reason.LATENCY_FULL, FULL_BUT_T1) == reason
