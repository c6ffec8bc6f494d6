"""The routing policies' names and parameters, each defined once.

Settings (YAML, ``TIERGATE_POLICY__*``), the policy catalog and the load tests all read them from
here: a parameter's default, bounds, meaning and its relations to the others live in
``PolicyParams`` and nowhere else.
"""

from __future__ import annotations

from typing import Final, Literal, Self, TypeGuard, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "DEFAULT_POLICY",
    "POLICY_NAMES",
    "ParamError",
    "PolicyName",
    "PolicyParams",
    "is_policy_name",
]

PolicyName = Literal[
    "learned", "golden-range", "least-loaded", "power-of-two", "round-robin", "latency-only",
    "throughput-only",
]
POLICY_NAMES: Final[tuple[str, ...]] = get_args(PolicyName)
DEFAULT_POLICY: Final[PolicyName] = "learned"


def is_policy_name(name: str) -> TypeGuard[PolicyName]:
    return name in POLICY_NAMES


class ParamError(ValueError):
    """An invalid parameter, named by ``field``: raised from a model validator, it lets a report
    point at ``policy.hysteresis`` rather than at the whole block."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class PolicyParams(BaseModel):
    """Every parameter a routing policy reads. Each policy takes what it needs at build time."""

    # Frozen: a built policy must not change under its callers; extras forbidden: a typo in a
    # parameter's name must not fall back to the default silently.
    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_max_concurrency: int = Field(
        default=16,
        gt=0,
        description="Golden range of the latency tier: it takes work while its least-loaded"
        " backend has fewer requests than this (16: the tutorial's EAGLE-3 batch size).",
    )
    hysteresis: int = Field(
        default=2,
        ge=0,
        description="Once closed at latency_max_concurrency, the latency tier reopens only"
        " below latency_max_concurrency - hysteresis; 0 flips exactly at the limit.",
    )
    latency_hard_cap: int = Field(
        default=24,
        gt=0,
        description="A latency backend at this many requests is saturated: past it, speculative"
        " decoding loses to the throughput tier. Sharing and overflow stop here.",
    )
    max_waiting: int = Field(
        default=8,
        ge=0,
        description="A backend whose fresh scrape shows more queued requests than this is"
        " saturated (under the fixed policies a throughput backend; their latency tier stops at"
        " latency_hard_cap); 0: any queued request saturates it.",
    )
    p2c_min_pool: int = Field(
        default=4,
        ge=2,
        description="Throughput pools with at least this many backends with room pick their"
        " first by power of two choices; smaller ones go strictly by load.",
    )

    slo_margin: float = Field(
        default=0.02,
        ge=0,
        lt=1,
        description="learned: a backend is predicted to meet an SLO only with this share of it"
        " to spare, for the latency model's error (the SLO is a cliff, the curve a mean).",
    )
    explore_rate: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="learned: share of decisions that send the request first to a backend the"
        " latency model has not observed for explore_after_s, so it keeps learning there (a"
        " conversation's turn only to one that decodes speculatively, or that nothing is known"
        " of). A backend that decodes speculatively is also tried once per explore_after_s"
        " while unobserved, whatever the draw (its speed changes unseen with its drafts'"
        " acceptance). 0: no exploration.",
    )
    explore_after_s: float = Field(
        default=10.0,
        gt=0,
        description="learned: a backend's model is unsure once it has gone this long without"
        " an observation.",
    )
    full_ttft_factor: float = Field(
        default=2.0,
        gt=0,
        description="learned: a backend is full (admission holds the request, then 429) when its"
        " predicted TTFT is beyond this many times the request's TTFT SLO.",
    )

    affinity_balance: float = Field(
        default=0.25,
        ge=0,
        description="Prefix-cache affinity for a session the client declares (`x-session-id`,"
        " `user`) and the gateway has not served lately: it goes to its own backend of the"
        " policy's tier (by consistent hashing) while that backend holds at most (1 + this) x"
        " the tier's mean load, so a hot session spills instead of piling onto one instance.",
    )
    affinity_slack: int = Field(
        default=2,
        ge=0,
        description="Requests a keyed backend may hold beyond (1 + affinity_balance) x its"
        " tier's mean load: at low load the mean is near 0 and a lagging scrape would otherwise"
        " move a conversation off the instance that has it cached.",
    )
    prefix_affinity: bool = Field(
        default=True,
        description="Send a conversation's later turns, a session's (`x-session-id`, `user`)"
        " requests and a repeated prompt prefix back to the backend that served them last, in"
        " either tier, while it is not saturated, has no queue where the policy's choice is"
        " idle, and the latency model predicts it meets the request's SLO (before its knee)"
        " where the policy's choice would. A prompt seen for"
        " the first time, or one other requests are using at the same moment, is routed by"
        " the policy alone, so prompts that never repeat cost nothing.",
    )
    affinity_yield: float = Field(
        default=2.0,
        ge=0,
        description="learned: a home the latency model knows gives way where the policy's choice"
        " is predicted to add more than this many times the SLO-meeting output per second the"
        " home would (an idle latency engine beside a conversation's pool instance): decoding"
        " that much faster saves more than the history's prefill there costs, for answers of a"
        " few dozen tokens or more. 0: a home that meets the SLO before its knee is kept.",
    )
    affinity_keys: int = Field(
        default=65536,
        ge=1,
        description="Affinity keys remembered (each with the backend that served it last),"
        " the least recently used forgotten first.",
    )
    affinity_quiet_after: int = Field(
        default=1024,
        ge=0,
        description="New affinity keys in a row, none of them seen again (prompts that never"
        " repeat), after which keying every request is work for nothing: only one request in"
        " `affinity_quiet_every` is keyed (its key remembered), and what may be a later turn (a"
        " chat past its opening, a prompt past the key's length) looked up, until a remembered"
        " key comes again. 0: every request always keyed.",
    )
    affinity_quiet_every: int = Field(
        default=16,
        ge=1,
        description="While nothing repeats (`affinity_quiet_after`), one request in this many"
        " is keyed and its key remembered, so that a conversation starting then is found at a"
        " later turn (a short prompt's exact repeat: where that repeat is drawn too).",
    )
    affinity_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description="A key not seen for this long is forgotten: its blocks have most likely"
        " left the engine's prefix cache, and its next request is routed as a new one.",
    )

    @model_validator(mode="after")
    def _check_relations(self) -> Self:
        if self.latency_hard_cap < self.latency_max_concurrency:
            raise ParamError(
                "latency_hard_cap",
                f"must be >= latency_max_concurrency ({self.latency_max_concurrency}),"
                f" got {self.latency_hard_cap}",
            )
        if self.hysteresis >= self.latency_max_concurrency:
            raise ParamError(
                "hysteresis",
                f"must be < latency_max_concurrency ({self.latency_max_concurrency}),"
                f" got {self.hysteresis}",
            )
        return self
