"""Prefix-cache affinity inside a tier: the same conversation, session or prompt prefix goes to
the same instance, so that the engine's prefix cache (vLLM's automatic prefix caching) holds its
earlier turns and only the new part is prefilled.

The policy chooses the tier (its first candidate's); this stage chooses the instance within it,
by consistent hashing with bounded loads: the tier's backends ranked by rendezvous hashing of
the request's affinity key (each key has its own fixed order of backends, and adding or removing
one moves only its keys), the first whose load stays within `(1 + balance)` times the tier's
mean load (counting this request) plus `slack` requests takes it. A hot key therefore spills
to its second choice instead of piling onto one instance: no backend goes past the bound because
of affinity. A saturated backend is never chosen for affinity; an unkeyed request keeps the
policy's order.

Pure, like every routing stage: the key is a 64-bit integer the intake derived from the request
(gateway.pipeline.intake), and the hashes are fixed functions of it and of the backend's URL, so
every gateway replica and worker maps a key to the same backend.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gateway.routing.params import PolicyParams
from gateway.routing.saturation import Saturation
from gateway.routing.types import Backend, Decision, LoadSnapshot, Reason, RouteRequest

__all__ = ["Affinity", "affinity_key", "rank"]

_MASK = (1 << 64) - 1
# Decisions whose first candidate affinity must not move: nothing has room, or the request or
# the policy chose that backend for a reason of its own.
_KEEP = frozenset({Reason.SATURATED, Reason.NO_BACKEND, Reason.EXPLORE, Reason.POLICY_ERROR})


def affinity_key(data: bytes) -> int:
    """A request's affinity key from the bytes that identify its prefix (stable across
    processes, unlike `hash()`)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads the bits of `x`."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def rank(key: int, pool: Sequence[Backend], urls: Mapping[str, int] | None = None) -> list[Backend]:
    """`pool` in `key`'s rendezvous order (highest random weight first); `urls`: the backends'
    URL hashes when known in advance (each is computed otherwise)."""
    known = urls or {}

    def weight(b: Backend) -> int:
        url = known.get(b.url)
        return _mix(key ^ (affinity_key(b.url.encode()) if url is None else url))

    return sorted(pool, key=weight, reverse=True)


@dataclass(frozen=True, slots=True)
class Affinity:
    # A backend takes keyed requests up to (1 + balance) x the tier's mean load, + slack.
    balance: float
    slack: int
    saturation: Saturation
    # The configured backends' URL hashes, computed once rather than in every decision.
    urls: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, params: PolicyParams, backends: Sequence[Backend] = ()) -> Affinity:
        urls = {b.url: affinity_key(b.url.encode()) for b in backends}
        return cls(params.affinity_balance, params.affinity_slack, Saturation.of(params), urls)

    def bound(self, loads: Sequence[int]) -> int:
        """The most requests a backend may hold after taking this one for affinity's sake."""
        mean = (sum(loads) + 1) / len(loads)
        return max(1, math.ceil((1 + self.balance) * mean)) + self.slack

    def __call__(self, req: RouteRequest, decision: Decision, snap: LoadSnapshot) -> Decision:
        """`decision` with its first candidate moved to the keyed backend of its tier, when
        one is within the load bound; unchanged otherwise."""
        ordered = decision.candidates
        if req.affinity is None or not ordered or decision.reason in _KEEP:
            return decision
        tier = ordered[0].tier
        pool = [b for b in ordered if b.tier == tier]
        if len(pool) < 2:
            return decision
        load, full = snap.load, self.saturation.backend
        loads = [load(b.url).effective for b in pool]
        bound = self.bound(loads)
        for b in rank(req.affinity, pool, self.urls):
            backend_load = load(b.url)
            if backend_load.effective + 1 <= bound and not full(b, backend_load):
                if b is ordered[0]:
                    return decision
                rest = tuple(x for x in ordered if x is not b)
                return decision._replace(candidates=(b, *rest))
        return decision
