"""When a backend, a pool, or a whole decision has no room left.

The app's admission control reads this through the decision's reason: ``saturated`` makes it
queue the request (up to ``queue_deadline_s``) or answer 429. Every policy reports it the same
way, so benchmarks compare placement, not admission control.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.routing.params import PolicyParams
from gateway.routing.types import Backend, BackendLoad, LoadSnapshot, Reason, Role, RouteRequest

__all__ = ["Saturation"]


@dataclass(frozen=True, slots=True)
class Saturation:
    latency_hard_cap: int
    max_waiting: int

    @classmethod
    def of(cls, params: PolicyParams) -> Saturation:
        return cls(latency_hard_cap=params.latency_hard_cap, max_waiting=params.max_waiting)

    def backend(self, b: Backend, load: BackendLoad) -> bool:
        if b.role is Role.LATENCY:
            # Past the hard cap, spec decoding loses to plain AWQ: no more room there.
            return load.effective >= self.latency_hard_cap
        # A stale scrape's queue length is old news (the gauges lag seconds even when fresh): do
        # not declare a backend full on it; its in-flight count still ranks it.
        return not load.stale and load.waiting > self.max_waiting

    def pool(self, pool: Iterable[Backend], snap: LoadSnapshot) -> bool:
        """Every backend of ``pool`` is saturated; true for an empty pool (no room there)."""
        backend, load = self.backend, snap.load
        for b in pool:  # noqa: SIM110 (all(<generator>) costs more; this runs on every decision)
            if not backend(b, load(b.url)):
                return False
        return True

    def reason(
        self, req: RouteRequest, ordered: Sequence[Backend], why: str, snap: LoadSnapshot
    ) -> str:
        """The decision's reason: what the policy said (``why``), unless there is no candidate,
        no candidate has room, or the request was pinned."""
        if not ordered:
            return Reason.NO_BACKEND
        if self.pool(ordered, snap):
            return Reason.SATURATED
        if req.pinned is not None:
            return Reason.PINNED
        return why
