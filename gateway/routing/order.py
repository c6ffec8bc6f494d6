"""In what order a pool's backends are tried: primary first, then the failover order.

The only randomness is the caller's ``random.Random``, drawn in a fixed order (the two-choice
sample first, then one tie-break per backend sorted), so a seed replays a decision exactly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.routing.params import PolicyParams
from gateway.routing.saturation import Saturation
from gateway.routing.types import Backend, LoadSnapshot

__all__ = ["Ordering", "by_load", "two_choices"]


def by_load(pool: Sequence[Backend], snap: LoadSnapshot, rng: random.Random) -> list[Backend]:
    """Least effective load first; the random second key breaks ties without favouring
    configuration order."""
    if not pool:
        return []
    load, draw = snap.load, rng.random
    return sorted(pool, key=lambda b: (load(b.url).effective, draw()))


def two_choices(pool: Sequence[Backend], snap: LoadSnapshot, rng: random.Random) -> list[Backend]:
    """Power of two choices: the lighter of two sampled backends first (the first sampled on a
    tie), then the rest by load. Near least-loaded quality, but replicas (or a lagging
    snapshot) do not all pile onto the same "least loaded" backend. Needs two backends."""
    a, b = rng.sample(pool, 2)
    first = b if snap.load(b.url).effective < snap.load(a.url).effective else a
    return [first, *by_load([x for x in pool if x.url != first.url], snap, rng)]


@dataclass(frozen=True, slots=True)
class Ordering:
    """How each tier's pool is ordered, with the parameters read once at build time."""

    saturation: Saturation
    p2c_min_pool: int

    @classmethod
    def of(cls, params: PolicyParams) -> Ordering:
        return cls(saturation=Saturation.of(params), p2c_min_pool=params.p2c_min_pool)

    def latency(
        self, pool: Sequence[Backend], snap: LoadSnapshot, rng: random.Random
    ) -> list[Backend]:
        return by_load(pool, snap, rng)

    def throughput(
        self, pool: Sequence[Backend], snap: LoadSnapshot, rng: random.Random
    ) -> list[Backend]:
        """Backends with room first (by two choices in a large enough pool), saturated ones
        last: a queue means the engine cannot batch more (KV or max_num_seqs), so more work
        only waits there, even if its running+waiting looks small."""
        saturated, load = self.saturation.backend, snap.load
        has_room: list[Backend] = []
        full: list[Backend] = []
        for b in pool:  # one pass: this runs on every decision
            (full if saturated(b, load(b.url)) else has_room).append(b)
        if len(has_room) >= self.p2c_min_pool:
            ordered = two_choices(has_room, snap, rng)
        else:
            ordered = by_load(has_room, snap, rng)
        return ordered + by_load(full, snap, rng)
