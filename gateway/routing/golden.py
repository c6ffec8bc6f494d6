"""``golden-range``, the default policy: the latency tier while it is in its golden range; past
it, the throughput pool, unless the latency tier (below its hard cap) is less loaded still.

Three pure steps per request: the hysteresis state follows the latency tier's level; while the
tier is open it goes first, else ``past_range`` picks the tier that goes first and why, from two
figures per tier; each tier's pool is ordered and the two are concatenated, so every eligible
backend is in the failover order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.routing.filters import eligible, split_roles
from gateway.routing.order import Ordering
from gateway.routing.params import PolicyParams
from gateway.routing.types import (
    Backend,
    Decision,
    LoadSnapshot,
    Reason,
    Role,
    RouteRequest,
    RouterState,
)

__all__ = ["GoldenRange", "Hysteresis", "Tier", "past_range"]


def _level(pool: Sequence[Backend], snap: LoadSnapshot) -> int | None:
    """A tier's level is its least-loaded backend's: the golden range is a per-engine batch size,
    so a second latency instance adds room rather than sharing one budget."""
    load = snap.load
    level: int | None = None
    for b in pool:  # a loop, not min(<generator>): this runs on every decision
        e = load(b.url).effective
        if level is None or e < level:
            level = e
    return level


@dataclass(frozen=True, slots=True)
class Hysteresis:
    """Close the latency tier at ``close_at``; reopen only once its level drops below
    ``reopen_below``, so it does not flap around the limit."""

    close_at: int
    reopen_below: int

    @classmethod
    def of(cls, params: PolicyParams) -> Hysteresis:
        cap = params.latency_max_concurrency
        return cls(close_at=cap, reopen_below=cap - params.hysteresis)

    def next(self, state: RouterState, level: int | None) -> RouterState:
        """The state after seeing the latency tier at ``level`` (None: no usable backend)."""
        if level is None:
            return state  # nothing observed, nothing learned
        if state.latency_open and level >= self.close_at:
            return replace(state, latency_open=False)
        if not state.latency_open and level < self.reopen_below:
            return replace(state, latency_open=True)
        return state


@dataclass(frozen=True, slots=True)
class Tier:
    """What ``past_range`` looks at in one tier."""

    level: int | None  # its least-loaded backend's effective load; None: no usable backend
    saturated: bool  # every backend saturated (true when there is none)


def past_range(latency: Tier, throughput: Tier, cap: int) -> tuple[Role, Reason]:
    """Which tier's pool goes first, and why, once the latency tier is out of its golden range
    (closed by the hysteresis, or without a usable backend); ``cap`` is the golden range
    (latency_max_concurrency)."""
    if (
        latency.level is not None
        and throughput.level is not None
        and not latency.saturated
        and latency.level < throughput.level
    ):
        # Past its golden range the latency tier still beats a throughput engine that is more
        # loaded than it (a speculative batch of 17..hard-cap sequences is faster per token than
        # a plain one of as many or more), so it shares load instead of idling at the cap.
        return Role.LATENCY, Reason.SHARED
    if not throughput.saturated:
        if latency.level is None:
            return Role.THROUGHPUT, Reason.NO_LATENCY
        if latency.level >= cap:
            return Role.THROUGHPUT, Reason.LATENCY_FULL
        return Role.THROUGHPUT, Reason.HYSTERESIS
    if not latency.saturated:
        return Role.LATENCY, Reason.OVERFLOW  # the pool is full: latency up to its hard cap
    # Everything is full (or there is nothing): still hand back an order for when room appears.
    return Role.THROUGHPUT, Reason.SATURATED


@dataclass(frozen=True, slots=True)
class GoldenRange:
    name: str
    hysteresis: Hysteresis
    order: Ordering

    @classmethod
    def build(cls, name: str, params: PolicyParams) -> GoldenRange:
        return cls(name=name, hysteresis=Hysteresis.of(params), order=Ordering.of(params))

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        latency, throughput = split_roles(eligible(req, snap))
        lat_level = _level(latency, snap)
        # The hysteresis state tracks the tier's level whatever this request is routed by.
        state = self.hysteresis.next(state, lat_level)
        saturation = self.order.saturation

        if req.pinned is not None:
            first, why = req.pinned, Reason.PINNED  # that tier's pool only, no failover
        elif lat_level is not None and state.latency_open:
            first, why = Role.LATENCY, Reason.GOLDEN_RANGE
        else:
            # Only now are the tiers' summaries needed: the common case above skips a scan.
            first, why = past_range(
                Tier(lat_level, saturation.pool(latency, snap)),
                Tier(_level(throughput, snap), saturation.pool(throughput, snap)),
                self.hysteresis.close_at,
            )
        if first is Role.LATENCY:
            ordered = self.order.latency(latency, snap, rng)
            if req.pinned is None:
                ordered += self.order.throughput(throughput, snap, rng)
        else:
            ordered = self.order.throughput(throughput, snap, rng)
            if req.pinned is None:
                ordered += self.order.latency(latency, snap, rng)
        reason = saturation.reason(req, ordered, why, snap)
        return Decision(candidates=tuple(ordered), reason=reason, policy=self.name, state=state)
