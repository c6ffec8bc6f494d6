"""Values the routing policies read and return. All immutable, so a decision can be replayed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.routing.frozen import rebuilt

if TYPE_CHECKING:
    from gateway.routing.curves import Prediction

__all__ = [
    "UNKNOWN_LOAD",
    "Backend",
    "BackendLoad",
    "Decision",
    "LoadSnapshot",
    "Reason",
    "Role",
    "RouteRequest",
    "RouterState",
    "Slo",
    "Stay",
    "by_tier",
]


class Role(StrEnum):
    """What a tier is for; the policy reasons about roles, config names the tiers."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"


class Reason(StrEnum):
    """Why a decision came out as it did; a metric label and an ``x-tiergate-*`` header value."""

    GOLDEN_RANGE = "golden_range"  # latency tier below its cap took it
    LATENCY_FULL = "latency_full"  # latency tier at its cap: throughput pool
    HYSTERESIS = "hysteresis"  # latency tier below its cap but not yet reopened
    SHARED = "shared"  # past the golden range, but less loaded than every throughput backend
    NO_LATENCY = "no_latency"  # no usable latency backend: throughput pool
    OVERFLOW = "overflow"  # throughput pool saturated: latency tier up to its hard cap
    SATURATED = "saturated"  # nowhere has room: the app queues or answers 429
    PINNED = "pinned"  # x-tiergate-tier chose the tier
    NO_BACKEND = "no_backend"
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    TWO_CHOICES = "two_choices"  # power-of-two: the less loaded of two drawn at random
    PREFERRED_TIER = "preferred_tier"  # latency-only / throughput-only got their tier
    FALLBACK_TIER = "fallback_tier"  # ... or had to use the other one
    PREDICTED_SLO_MET = "predicted_slo_met"  # learned: predicted to meet the request's SLO there
    HEADROOM = "headroom"  # learned: predicted to meet it nowhere; the most headroom went first
    EXPLORE = "explore"  # learned: a backend the model has not seen lately, to keep learning
    FRONTIER = "frontier"  # learned: past the most streams observed there (or none yet)
    RESERVED = "reserved"  # learned: the faster place kept for a tighter class; this one meets it
    DRAIN = "drain"  # learned: nothing gains; the overflow to the least sink, so a pile drains
    POLICY_ERROR = "policy_error"  # the policy failed (a bug): least-loaded ordered it instead
    DISPLACED = "displaced"  # saturated, but a batch request waiting there gave it its place


class Stay(StrEnum):
    """What prefix affinity did with a request that has a home or a declared session (a metric
    label and a field of the request's log line): where a conversation left its prefix cache,
    the check that sent it away (gateway.routing.affinity)."""

    HOME = "home"  # served first at its home (the policy's choice, or moved there)
    SESSION = "session"  # a declared session, first seen: its own backend of the policy's tier
    GONE = "gone"  # the home is not among the candidates (unhealthy, excluded, removed)
    POLICY = "policy"  # the policy's choice stands for a reason of its own (saturated, reserved)
    SATURATED = "saturated"  # the home has no room by the policy's own measure
    QUEUE = "queue"  # requests queue at the home while the policy's choice holds none
    FULL = "full"  # the latency model reads the home full
    MISS = "miss"  # the home predicted to miss the SLO where the choice would meet it
    UNKNOWN = "unknown"  # nothing known of the choice, the home past its knee or missing its SLO
    GIVE_WAY = "give_way"  # the choice adds more output than the home, beyond the move's prefill
    PAST_KNEE = "past_knee"  # the home past its knee loses more output than the move's prefill


@dataclass(frozen=True, slots=True)
class Backend:
    """One engine instance. ``url`` (its base URL) is its identity everywhere."""

    url: str
    tier: str
    role: Role
    models: frozenset[str]

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return rebuilt(self)


class BackendLoad(NamedTuple):
    """Monitor's view of one backend at snapshot time. (A named tuple, as `Decision`: the
    registry builds one per backend for every decision, and a frozen dataclass's generated
    __init__, one object.__setattr__ per field, cost 18,600 instructions a load against 4,100
    for a named tuple built from positions: docs/results/instructions-request-path.)"""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    inflight: int = 0
    healthy: bool = True
    stale: bool = False
    # The TPOT SLOs (seconds) of this gateway's requests in flight here, with their counts,
    # tightest first: the streams one more request would slow down, and by how much they may slow.
    slos: tuple[tuple[float, int], ...] = ()
    # Per TPOT SLO, the mean count of this gateway's streams here lately (a minute or so),
    # tightest first: the classes that come here, whether in flight now or not.
    recent: tuple[tuple[float, float], ...] = ()
    # The in-flight count when the gauges were scraped: the streams they showed beyond it were
    # not the gateway's (clients beside it, or replicas that share no state). None: not known.
    inflight_at_scrape: int | None = None

    @property
    def effective(self) -> int:
        # vLLM's queue gauges lag (a scrape interval at least), our own in-flight count does not:
        # ours now, plus what the last scrape saw beyond ours then (so a stream of ours that
        # ended since the scrape no longer counts); the larger of the two if that is not known,
        # and only the in-flight count once the scrape is stale.
        # (Spelled out rather than max(): every decision reads this several times per backend.)
        if self.stale:
            return self.inflight
        queued = self.running + self.waiting
        at = self.inflight_at_scrape
        if at is not None:
            return self.inflight + queued - at if queued > at else self.inflight
        return queued if queued > self.inflight else self.inflight


def by_tier(backends: Sequence[Backend]) -> tuple[tuple[Backend, ...], ...]:
    """`backends` grouped by tier: the tiers in the order they first appear, each one's
    backends in their order."""
    tiers: dict[str, list[Backend]] = {}
    for b in backends:  # (setdefault would build a list per backend)
        members = tiers.get(b.tier)
        if members is None:
            tiers[b.tier] = [b]
        else:
            members.append(b)
    return tuple(tuple(members) for members in tiers.values())


# A backend the monitor has not reported yet: usable, nothing known about it but our own count.
UNKNOWN_LOAD = BackendLoad(stale=True)


@dataclass(slots=True)
class LoadSnapshot:
    """Every configured backend and its load at one instant. Read only: routing's stages are
    pure functions of it. (Not a frozen dataclass, which would say so at run time: the registry
    builds one for every decision, and a frozen one's generated __init__, an object.__setattr__
    per field, cost 16,600 instructions against 6,500: docs/results/instructions-quiet-draw.)"""

    backends: tuple[Backend, ...]
    loads: Mapping[str, BackendLoad] = field(default_factory=lambda: MappingProxyType({}))
    taken_at: float = 0.0
    # The latency model's predictions per backend url (gateway.routing.curves.Prediction), for
    # the policies that read them; not part of a snapshot's identity.
    curves: Mapping[str, Prediction] = field(
        default_factory=lambda: MappingProxyType({}), compare=False
    )
    # The copy behind ``loads``, which ``load`` reads directly: a decision reads a few hundred
    # loads, and each read through the proxy costs half as much again. Read only; a stage that
    # reads every backend's load takes its ``get`` (``by_url.get(url, UNKNOWN_LOAD)`` is
    # ``load(url)`` without a call in between).
    by_url: dict[str, BackendLoad] = field(init=False, repr=False, compare=False)
    # Whether no URL is listed twice in ``backends`` (the registry's are keyed by URL), so
    # that `gateway.routing.filters.eligible` need not look for second listings.
    distinct: bool = field(default=False, compare=False)
    # ``backends`` by tier (`by_tier`): given by whoever keeps the same backends for many
    # snapshots (the registry), so that a decision need not group them; drawn here if not.
    tiers: tuple[tuple[Backend, ...], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        # Copy, so a caller mutating its dict cannot change a snapshot a decision was made on.
        self.by_url = by_url = dict(self.loads)
        self.loads = MappingProxyType(by_url)
        if not self.tiers and self.backends:
            self.tiers = by_tier(self.backends)

    def load(self, url: str) -> BackendLoad:
        return self.by_url.get(url, UNKNOWN_LOAD)

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return rebuilt(self)


@dataclass(frozen=True, slots=True)
class Slo:
    """What a request needs: its first token within ``ttft_s``, then ``tpot_s`` per token."""

    ttft_s: float = 1.0
    tpot_s: float = 0.025
    # ln(tpot_s), which the learned policy reads for every candidate of a decision.
    log_tpot: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_tpot", math.log(self.tpot_s) if self.tpot_s > 0 else -1e9)

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return rebuilt(self)


_DEFAULT_SLO = Slo()


class RouteRequest(NamedTuple):
    """The features of a request that routing may look at. (A named tuple: one is built per
    request, and a frozen dataclass of such fields costs three times as much to build.)"""

    model: str
    pinned: Role | None = None
    stream: bool = False
    exclude: frozenset[str] = frozenset()
    slo: Slo = _DEFAULT_SLO
    # What identifies its prompt's prefix (gateway.routing.affinity.affinity_key): requests
    # sharing it go back to the backend that has that prefix cached.
    affinity: int | None = None
    # The URL of the backend that served the key last (None: not seen lately, or in use by
    # another request right now, as a prefix many share is).
    home: str | None = None
    # Whether the key names a session the client declared (`x-session-id`, `user`) rather than
    # a prompt's prefix: one seen for the first time still goes to its own backend of a tier.
    session: bool = False
    # Where it has a home: its prompt's tokens (an estimate) and the most it may generate (0:
    # not said): what a move off its prefix cache costs in prefill, against what decoding
    # elsewhere saves (gateway.routing.affinity).
    prompt_tokens: int = 0
    max_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RouterState:
    """What a policy remembers between decisions; the caller threads it through."""

    latency_open: bool = True  # hysteresis: is the latency tier accepting work
    rr: int = 0  # round-robin position
    # (backend URL, when the learned policy last explored it), for backends it explored.
    explored: tuple[tuple[str, float], ...] = ()

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return rebuilt(self)


class Decision(NamedTuple):
    """A policy's answer. (A named tuple: one is built per request, and a frozen dataclass costs
    three times as much to build.)"""

    candidates: tuple[Backend, ...]  # primary first, then failover order
    reason: str
    policy: str
    state: RouterState  # the state for the next decision
    # What prefix affinity did (a Stay; empty: it was not asked: no home, no declared session).
    affinity: str = ""

    @property
    def primary(self) -> Backend | None:
        return self.candidates[0] if self.candidates else None
