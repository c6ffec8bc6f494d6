"""Routing policies: pure functions of (request, snapshot, state, params, rng) -> Decision.

No I/O, no clock: everything a policy may look at is passed in, the only randomness is the
caller's seeded ``random.Random``, and what a policy remembers comes back in
``Decision.state`` for the caller to pass to the next call. The same inputs give the same
decision, so any routing choice can be replayed from a log.

Every policy returns a full failover order (primary first). All of them honour the
``x-tiergate-tier`` pin (strictly: a pinned request never fails over to the other tier) and
report ``saturated`` when no candidate has room, so benchmarks compare placement, not
admission control.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from gateway.routing.types import (
    Backend,
    Decision,
    LoadSnapshot,
    PolicyParams,
    Reason,
    Role,
    RouteRequest,
    RouterState,
)

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Policy",
    "get_policy",
    "golden_range",
    "latency_only",
    "least_loaded",
    "round_robin",
    "throughput_only",
]

Policy = Callable[[RouteRequest, LoadSnapshot, RouterState, PolicyParams, random.Random], Decision]


def _eligible(req: RouteRequest, snap: LoadSnapshot) -> list[Backend]:
    """Healthy, not excluded, serving the model; unique by url; in configuration order."""
    seen: set[str] = set()
    out: list[Backend] = []
    for b in snap.backends:
        if b.url in seen:
            continue
        seen.add(b.url)
        if b.url in req.exclude or req.model not in b.models or not snap.load(b.url).healthy:
            continue
        out.append(b)
    return out


def _of_role(pool: Sequence[Backend], role: Role) -> list[Backend]:
    return [b for b in pool if b.role is role]


def _saturated(b: Backend, snap: LoadSnapshot, params: PolicyParams) -> bool:
    load = snap.load(b.url)
    if b.role is Role.LATENCY:
        # Past the hard cap, spec decoding loses to plain AWQ: no more room there.
        return load.effective >= params.latency_hard_cap
    # A stale scrape's queue length is old news (the gauges lag seconds even when fresh): do not
    # declare a backend full on it; its in-flight count still ranks it.
    return not load.stale and load.waiting > params.max_waiting


def _all_saturated(pool: Sequence[Backend], snap: LoadSnapshot, params: PolicyParams) -> bool:
    return all(_saturated(b, snap, params) for b in pool)


def _by_load(pool: Sequence[Backend], snap: LoadSnapshot, rng: random.Random) -> list[Backend]:
    # The random second key breaks ties without favouring configuration order.
    return sorted(pool, key=lambda b: (snap.load(b.url).effective, rng.random()))


def _order_latency(
    pool: Sequence[Backend], snap: LoadSnapshot, params: PolicyParams, rng: random.Random
) -> list[Backend]:
    return _by_load(pool, snap, rng)


def _order_throughput(
    pool: Sequence[Backend], snap: LoadSnapshot, params: PolicyParams, rng: random.Random
) -> list[Backend]:
    # Backends with a long queue go last even if their running+waiting looks small: a queue
    # means the engine cannot batch more (KV or max_num_seqs), so more work only waits.
    has_room = [b for b in pool if not _saturated(b, snap, params)]
    full = [b for b in pool if _saturated(b, snap, params)]
    if len(has_room) >= params.p2c_min_pool:
        # Power of two choices: near least-loaded quality, but replicas (or a lagging snapshot)
        # do not all pile onto the same "least loaded" backend.
        a, b = rng.sample(has_room, 2)
        first = b if snap.load(b.url).effective < snap.load(a.url).effective else a
        rest = _by_load([x for x in has_room if x.url != first.url], snap, rng)
        ordered = [first, *rest]
    else:
        ordered = _by_load(has_room, snap, rng)
    return ordered + _by_load(full, snap, rng)


def _next_hysteresis(
    state: RouterState, latency: Sequence[Backend], snap: LoadSnapshot, params: PolicyParams
) -> RouterState:
    """Close the latency tier at the cap; reopen only once it drops below cap - hysteresis.

    The tier's level is its least-loaded backend: the golden range is a per-engine batch size,
    so a second latency instance adds room rather than sharing one budget.
    """
    if not latency:
        return state  # nothing observed, nothing learned
    level = min(snap.load(b.url).effective for b in latency)
    if state.latency_open and level >= params.latency_max_concurrency:
        return replace(state, latency_open=False)
    if not state.latency_open and level < params.latency_max_concurrency - params.hysteresis:
        return replace(state, latency_open=True)
    return state


def _decide(
    name: str,
    req: RouteRequest,
    ordered: Sequence[Backend],
    reason: str,
    state: RouterState,
    snap: LoadSnapshot,
    params: PolicyParams,
) -> Decision:
    if not ordered:
        reason = Reason.NO_BACKEND
    elif _all_saturated(ordered, snap, params):
        reason = Reason.SATURATED
    elif req.pinned is not None:
        reason = Reason.PINNED
    return Decision(candidates=tuple(ordered), reason=reason, policy=name, state=state)


def golden_range(
    req: RouteRequest,
    snap: LoadSnapshot,
    state: RouterState,
    params: PolicyParams,
    rng: random.Random,
) -> Decision:
    """The default: the latency tier while it is in its golden range; past it, the least-loaded
    throughput backend, unless the latency tier (below its hard cap) is less loaded still."""
    name = "golden-range"
    eligible = _eligible(req, snap)
    latency = _of_role(eligible, Role.LATENCY)
    throughput = _of_role(eligible, Role.THROUGHPUT)
    # The hysteresis state tracks the tier's level whatever this request is routed by.
    state = _next_hysteresis(state, latency, snap, params)

    if req.pinned is Role.LATENCY:
        ordered = _order_latency(latency, snap, params, rng)
        return _decide(name, req, ordered, Reason.PINNED, state, snap, params)
    if req.pinned is Role.THROUGHPUT:
        ordered = _order_throughput(throughput, snap, params, rng)
        return _decide(name, req, ordered, Reason.PINNED, state, snap, params)

    if latency and state.latency_open:
        ordered = _order_latency(latency, snap, params, rng)
        ordered += _order_throughput(throughput, snap, params, rng)
        return _decide(name, req, ordered, Reason.GOLDEN_RANGE, state, snap, params)

    if latency and throughput and not _all_saturated(latency, snap, params):
        # Past its golden range the latency tier still beats a throughput engine that is more
        # loaded than it (a speculative batch of 17..hard-cap sequences is faster per token
        # than a plain one of as many or more), so it shares load instead of idling at the cap.
        level = min(snap.load(b.url).effective for b in latency)
        if level < min(snap.load(b.url).effective for b in throughput):
            ordered = _order_latency(latency, snap, params, rng)
            ordered += _order_throughput(throughput, snap, params, rng)
            return _decide(name, req, ordered, Reason.SHARED, state, snap, params)

    if not _all_saturated(throughput, snap, params):  # false for an empty pool
        ordered = _order_throughput(throughput, snap, params, rng)
        ordered += _order_latency(latency, snap, params, rng)
        if not latency:
            why = Reason.NO_LATENCY
        elif min(snap.load(b.url).effective for b in latency) >= params.latency_max_concurrency:
            why = Reason.LATENCY_FULL
        else:
            why = Reason.HYSTERESIS
        return _decide(name, req, ordered, why, state, snap, params)

    if not _all_saturated(latency, snap, params):  # so latency is not empty
        ordered = _order_latency(latency, snap, params, rng)
        ordered += _order_throughput(throughput, snap, params, rng)
        return _decide(name, req, ordered, Reason.OVERFLOW, state, snap, params)

    # Everything is full (or there is nothing): still hand back an order for when room appears.
    ordered = _order_throughput(throughput, snap, params, rng)
    ordered += _order_latency(latency, snap, params, rng)
    return _decide(name, req, ordered, Reason.SATURATED, state, snap, params)


def least_loaded(
    req: RouteRequest,
    snap: LoadSnapshot,
    state: RouterState,
    params: PolicyParams,
    rng: random.Random,
) -> Decision:
    """Tier-blind baseline: every candidate by effective load."""
    pool = _eligible(req, snap)
    if req.pinned is not None:
        pool = _of_role(pool, req.pinned)
    ordered = _by_load(pool, snap, rng)
    return _decide("least-loaded", req, ordered, Reason.LEAST_LOADED, state, snap, params)


def round_robin(
    req: RouteRequest,
    snap: LoadSnapshot,
    state: RouterState,
    params: PolicyParams,
    rng: random.Random,
) -> Decision:
    """Load-blind baseline: rotate through candidates; failover continues the rotation."""
    pool = _eligible(req, snap)
    if req.pinned is not None:
        pool = _of_role(pool, req.pinned)
    if not pool:
        return _decide("round-robin", req, (), Reason.ROUND_ROBIN, state, snap, params)
    start = state.rr % len(pool)
    ordered = pool[start:] + pool[:start]
    next_state = replace(state, rr=(start + 1) % len(pool))
    return _decide("round-robin", req, ordered, Reason.ROUND_ROBIN, next_state, snap, params)


def _tier_first(
    name: str,
    preferred: Role,
    req: RouteRequest,
    snap: LoadSnapshot,
    state: RouterState,
    params: PolicyParams,
    rng: random.Random,
) -> Decision:
    eligible = _eligible(req, snap)
    if req.pinned is not None:
        eligible = _of_role(eligible, req.pinned)
    latency = _order_latency(_of_role(eligible, Role.LATENCY), snap, params, rng)
    throughput = _order_throughput(_of_role(eligible, Role.THROUGHPUT), snap, params, rng)
    first, second = (latency, throughput) if preferred is Role.LATENCY else (throughput, latency)
    why = Reason.PREFERRED_TIER if first else Reason.FALLBACK_TIER
    return _decide(name, req, first + second, why, state, snap, params)


def latency_only(
    req: RouteRequest,
    snap: LoadSnapshot,
    state: RouterState,
    params: PolicyParams,
    rng: random.Random,
) -> Decision:
    """Baseline "everything on EAGLE-3": the throughput tier only as failover."""
    return _tier_first("latency-only", Role.LATENCY, req, snap, state, params, rng)


def throughput_only(
    req: RouteRequest,
    snap: LoadSnapshot,
    state: RouterState,
    params: PolicyParams,
    rng: random.Random,
) -> Decision:
    """Baseline "everything on the AWQ pool": the latency tier only as failover."""
    return _tier_first("throughput-only", Role.THROUGHPUT, req, snap, state, params, rng)


DEFAULT_POLICY = "golden-range"

POLICIES: Mapping[str, Policy] = MappingProxyType(
    {
        "golden-range": golden_range,
        "least-loaded": least_loaded,
        "round-robin": round_robin,
        "latency-only": latency_only,
        "throughput-only": throughput_only,
    }
)


def get_policy(name: str) -> Policy:
    """The policy called ``name``; a KeyError that lists the valid names otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown routing policy {name!r}; choose from {sorted(POLICIES)}") from None
