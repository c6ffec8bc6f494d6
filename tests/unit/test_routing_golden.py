"""The golden-range policy's own stages (gateway.routing.golden): the hysteresis and the choice
of the leading tier past the golden range. The policy end to end: test_routing.py."""

from __future__ import annotations

import pytest

from gateway.routing import PolicyParams, Reason, Role, RouterState
from gateway.routing.golden import Hysteresis, Tier, past_range

OPEN = RouterState(latency_open=True, rr=3)
CLOSED = RouterState(latency_open=False, rr=3)
DEFAULT = Hysteresis.of(PolicyParams())  # closes at 16, reopens below 14
NONE = Hysteresis.of(PolicyParams(hysteresis=0))  # closes at 16, reopens below 16

HYSTERESIS: dict[str, tuple[Hysteresis, RouterState, int | None, RouterState]] = {
    "open-below-cap-stays-open": (DEFAULT, OPEN, 15, OPEN),
    "open-at-cap-closes": (DEFAULT, OPEN, 16, CLOSED),
    "open-above-cap-closes": (DEFAULT, OPEN, 40, CLOSED),
    "closed-below-cap-stays-closed": (DEFAULT, CLOSED, 15, CLOSED),
    "closed-at-reopen-boundary-stays-closed": (DEFAULT, CLOSED, 14, CLOSED),
    "closed-below-reopen-boundary-opens": (DEFAULT, CLOSED, 13, OPEN),
    "closed-idle-opens": (DEFAULT, CLOSED, 0, OPEN),
    "closed-above-cap-stays-closed": (DEFAULT, CLOSED, 30, CLOSED),
    "no-latency-backend-open-unchanged": (DEFAULT, OPEN, None, OPEN),
    "no-latency-backend-closed-unchanged": (DEFAULT, CLOSED, None, CLOSED),
    "no-hysteresis-reopens-just-below-cap": (NONE, CLOSED, 15, OPEN),
    "no-hysteresis-closes-at-cap": (NONE, OPEN, 16, CLOSED),
    "smallest-range-closes-at-one": (
        Hysteresis.of(PolicyParams(latency_max_concurrency=1, hysteresis=0)),
        OPEN,
        1,
        CLOSED,
    ),
}


@pytest.mark.parametrize(
    ("hysteresis", "state", "level", "expected"), HYSTERESIS.values(), ids=HYSTERESIS.keys()
)
def test_hysteresis(
    hysteresis: Hysteresis, state: RouterState, level: int | None, expected: RouterState
) -> None:
    assert hysteresis.next(state, level) == expected  # rr untouched


def test_hysteresis_from_params() -> None:
    built = Hysteresis.of(PolicyParams(latency_max_concurrency=10, hysteresis=3))
    assert built == Hysteresis(close_at=10, reopen_below=7)


NO_TIER = Tier(level=None, saturated=True)
CAP = 16

# (latency, throughput) -> which pool leads and why, with the latency tier out of its range.
PAST_RANGE: dict[str, tuple[Tier, Tier, Role, Reason]] = {
    "shares-with-a-busier-pool": (Tier(18, False), Tier(20, False), Role.LATENCY, Reason.SHARED),
    "tie-goes-to-the-pool": (
        Tier(20, False),
        Tier(20, False),
        Role.THROUGHPUT,
        Reason.LATENCY_FULL,
    ),
    "lighter-pool-takes-it": (
        Tier(19, False),
        Tier(18, False),
        Role.THROUGHPUT,
        Reason.LATENCY_FULL,
    ),
    "no-sharing-at-the-hard-cap": (
        Tier(24, True),
        Tier(30, False),
        Role.THROUGHPUT,
        Reason.LATENCY_FULL,
    ),
    "shares-with-a-saturated-busier-pool": (
        Tier(18, False),
        Tier(20, True),
        Role.LATENCY,
        Reason.SHARED,
    ),
    "below-cap-but-closed-is-hysteresis": (
        Tier(15, False),
        Tier(3, False),
        Role.THROUGHPUT,
        Reason.HYSTERESIS,
    ),
    "at-cap-is-latency-full": (
        Tier(16, False),
        Tier(16, False),
        Role.THROUGHPUT,
        Reason.LATENCY_FULL,
    ),
    "no-latency-tier": (NO_TIER, Tier(3, False), Role.THROUGHPUT, Reason.NO_LATENCY),
    "no-latency-tier-busy-pool": (NO_TIER, Tier(90, False), Role.THROUGHPUT, Reason.NO_LATENCY),
    "pool-saturated-overflows": (Tier(18, False), Tier(10, True), Role.LATENCY, Reason.OVERFLOW),
    "no-pool-overflows": (Tier(17, False), NO_TIER, Role.LATENCY, Reason.OVERFLOW),
    "no-pool-below-cap-overflows": (Tier(3, False), NO_TIER, Role.LATENCY, Reason.OVERFLOW),
    "everything-saturated": (Tier(24, True), Tier(10, True), Role.THROUGHPUT, Reason.SATURATED),
    "latency-saturated-no-pool": (Tier(24, True), NO_TIER, Role.THROUGHPUT, Reason.SATURATED),
    "nothing-at-all": (NO_TIER, NO_TIER, Role.THROUGHPUT, Reason.SATURATED),
}


@pytest.mark.parametrize(
    ("latency", "throughput", "first", "reason"), PAST_RANGE.values(), ids=PAST_RANGE.keys()
)
def test_past_range(latency: Tier, throughput: Tier, first: Role, reason: Reason) -> None:
    assert past_range(latency, throughput, CAP) == (first, reason)
