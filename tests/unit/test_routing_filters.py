"""Which backends a request may go to (gateway.routing.filters)."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.routing import Backend, LoadSnapshot, Role, RouteRequest
from gateway.routing.filters import eligible, of_role, pinned, split_roles
from tests.unit.routingfixtures import L0, L1, MODEL, OTHER, T0, T1, T2, T_OTHER, lat, load, snap

L0_OTHER_ONLY = lat(0, frozenset({OTHER}))  # L0's url, listed as serving another model

ELIGIBLE: dict[str, tuple[LoadSnapshot, RouteRequest, list[Backend]]] = {
    "configuration-order-not-load-order": (
        snap((T1, load(9)), (L0, load(0)), (T0, load(3))),
        RouteRequest(MODEL),
        [T1, L0, T0],
    ),
    "other-model-left-out": (
        snap((L0, load()), (T_OTHER, load()), (T0, load())),
        RouteRequest(MODEL),
        [L0, T0],
    ),
    "only-the-other-models-backends": (
        snap((L0, load()), (T_OTHER, load()), (T0, load())),
        RouteRequest(OTHER),
        [T_OTHER],
    ),
    "unknown-model": (snap((L0, load()), (T0, load())), RouteRequest("gpt-4"), []),
    "unhealthy-left-out": (
        snap((L0, load(healthy=False)), (T0, load()), (T1, load(healthy=False))),
        RouteRequest(MODEL),
        [T0],
    ),
    "unscraped-counts-as-healthy": (snap((L0, None), (T0, load())), RouteRequest(MODEL), [L0, T0]),
    "stale-still-eligible": (snap((T0, load(stale=True))), RouteRequest(MODEL), [T0]),
    "excluded-left-out": (
        snap((L0, load()), (T0, load()), (T1, load())),
        RouteRequest(MODEL, exclude=frozenset({L0.url, T1.url})),
        [T0],
    ),
    "exclude-of-an-unknown-url": (
        snap((T0, load())),
        RouteRequest(MODEL, exclude=frozenset({"http://elsewhere:1"})),
        [T0],
    ),
    "duplicate-url-listed-once": (
        snap((L0, load()), (T0, load()), (T0, load()), (L0, load())),
        RouteRequest(MODEL),
        [L0, T0],
    ),
    "duplicate-url-first-listing-decides": (
        # The url is the engine's identity: its second listing does not bring it back.
        snap((L0_OTHER_ONLY, load()), (L0, load()), (T0, load())),
        RouteRequest(MODEL),
        [T0],
    ),
    "pin-is-not-a-filter-here": (
        snap((L0, load()), (T0, load())),
        RouteRequest(MODEL, pinned=Role.LATENCY),
        [L0, T0],
    ),
    "empty-snapshot": (snap(), RouteRequest(MODEL), []),
}


@pytest.mark.parametrize(("snapshot", "req", "expected"), ELIGIBLE.values(), ids=ELIGIBLE.keys())
def test_eligible(snapshot: LoadSnapshot, req: RouteRequest, expected: list[Backend]) -> None:
    assert eligible(req, snapshot) == expected
    urls = [b.url for b in snapshot.backends]
    if len(set(urls)) == len(urls):  # as the registry's: the same answer without the search
        assert eligible(req, dataclasses.replace(snapshot, distinct=True)) == expected


ROLES: dict[str, tuple[list[Backend], list[Backend], list[Backend]]] = {
    "mixed-keeps-order": ([T1, L0, T0, L1], [L0, L1], [T1, T0]),
    "latency-only": ([L1, L0], [L1, L0], []),
    "throughput-only": ([T0], [], [T0]),
    "empty": ([], [], []),
}


@pytest.mark.parametrize(("pool", "latency", "throughput"), ROLES.values(), ids=ROLES.keys())
def test_roles(pool: list[Backend], latency: list[Backend], throughput: list[Backend]) -> None:
    assert split_roles(pool) == (latency, throughput)
    assert of_role(pool, Role.LATENCY) == latency
    assert of_role(pool, Role.THROUGHPUT) == throughput


PINS: dict[str, tuple[Role | None, list[Backend], list[Backend]]] = {
    "no-pin-keeps-the-pool": (None, [T1, L0, T0], [T1, L0, T0]),
    "latency-pin": (Role.LATENCY, [T1, L0, T0, L1], [L0, L1]),
    "throughput-pin": (Role.THROUGHPUT, [T1, L0, T0], [T1, T0]),
    "pinned-tier-absent-no-failover": (Role.LATENCY, [T0, T1, T2], []),
    "no-pin-empty-pool": (None, [], []),
}


@pytest.mark.parametrize(("pin", "pool", "expected"), PINS.values(), ids=PINS.keys())
def test_pinned(pin: Role | None, pool: list[Backend], expected: list[Backend]) -> None:
    assert pinned(RouteRequest(MODEL, pinned=pin), pool) == expected
