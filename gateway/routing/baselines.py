"""The baselines the tier-aware policies are benchmarked against: tier-blind (least-loaded,
round-robin, power-of-two: what vLLM Router and SGLang's gateway do) and single-tier
(latency-only, throughput-only, the other tier only as failover)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Self

from gateway.routing.filters import eligible, of_role, pinned
from gateway.routing.order import Ordering, by_load
from gateway.routing.params import PolicyParams
from gateway.routing.saturation import Saturation
from gateway.routing.types import Decision, LoadSnapshot, Reason, Role, RouteRequest, RouterState

__all__ = ["LeastLoaded", "PowerOfTwo", "RoundRobin", "TierFirst"]


@dataclass(frozen=True, slots=True)
class _TierBlind:
    """A policy that reads only the saturation limits of its parameters."""

    name: str
    saturation: Saturation

    @classmethod
    def build(cls, name: str, params: PolicyParams) -> Self:
        return cls(name=name, saturation=Saturation.of(params))


@dataclass(frozen=True, slots=True)
class LeastLoaded(_TierBlind):
    """Every candidate by effective load, whatever its tier."""

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        ordered = by_load(pinned(req, eligible(req, snap)), snap, rng)
        reason = self.saturation.reason(req, ordered, Reason.LEAST_LOADED, snap)
        return Decision(candidates=tuple(ordered), reason=reason, policy=self.name, state=state)


@dataclass(frozen=True, slots=True)
class PowerOfTwo(_TierBlind):
    """vLLM Router's and SGLang's `power_of_two` as they run in front of vLLM engines (no load
    endpoint to poll): two distinct candidates drawn at random, whatever their tier, the one with
    fewer requests in flight through the router first (the first drawn on a tie), then the rest
    by load."""

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        pool = pinned(req, eligible(req, snap))
        if len(pool) >= 2:
            a, b = rng.sample(pool, 2)
            first = b if snap.load(b.url).inflight < snap.load(a.url).inflight else a
            pool = [first, *by_load([x for x in pool if x is not first], snap, rng)]
        reason = self.saturation.reason(req, pool, Reason.TWO_CHOICES, snap)
        return Decision(candidates=tuple(pool), reason=reason, policy=self.name, state=state)


@dataclass(frozen=True, slots=True)
class RoundRobin(_TierBlind):
    """Load-blind: rotate through the candidates; the failover order continues the rotation."""

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        pool = pinned(req, eligible(req, snap))
        if pool:
            start = state.rr % len(pool)
            pool = pool[start:] + pool[:start]
            state = replace(state, rr=(start + 1) % len(pool))
        reason = self.saturation.reason(req, pool, Reason.ROUND_ROBIN, snap)
        return Decision(candidates=tuple(pool), reason=reason, policy=self.name, state=state)


@dataclass(frozen=True, slots=True)
class TierFirst:
    """One tier first (``preferred``), the other only as failover: "everything on EAGLE-3"
    (latency-only) or "everything on the AWQ pool" (throughput-only)."""

    name: str
    preferred: Role
    order: Ordering

    @classmethod
    def latency_first(cls, name: str, params: PolicyParams) -> TierFirst:
        return cls(name=name, preferred=Role.LATENCY, order=Ordering.of(params))

    @classmethod
    def throughput_first(cls, name: str, params: PolicyParams) -> TierFirst:
        return cls(name=name, preferred=Role.THROUGHPUT, order=Ordering.of(params))

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        pool = pinned(req, eligible(req, snap))
        latency = self.order.latency(of_role(pool, Role.LATENCY), snap, rng)
        throughput = self.order.throughput(of_role(pool, Role.THROUGHPUT), snap, rng)
        first, second = (
            (latency, throughput) if self.preferred is Role.LATENCY else (throughput, latency)
        )
        why = Reason.PREFERRED_TIER if first else Reason.FALLBACK_TIER
        ordered = first + second
        reason = self.order.saturation.reason(req, ordered, why, snap)
        return Decision(candidates=tuple(ordered), reason=reason, policy=self.name, state=state)
