"""Admission control: route the exchange, or hold it while every backend is saturated.

A saturated decision (the policy's saturation detector: the latency tier at its hard cap, every
throughput backend with a long queue) waits until capacity may have freed (a lease given back
wakes the longest waiter, new load figures from the monitor wake all: the registry's change
signal) and is decided again, up to `policy.queue_deadline_s`. Then the client gets 429 with
Retry-After; with no backend in rotation at all, 503 (unless one that discovery found is about to
be probed: then the request waits for it as for room).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.backends.registry import ChangeSignal
from gateway.core.errors import GatewayError
from gateway.core.exchange import Exchange
from gateway.observe.telemetry import Telemetry
from gateway.routing import Backend, Decision, Reason, RouteRequest

__all__ = ["Admission", "Queueing"]

_RETRY_AFTER = [(b"retry-after", b"1")]


@dataclass(frozen=True, slots=True)
class Queueing:
    """How admission holds what it cannot route yet."""

    deadline_s: float  # how long a request may wait for room before its 429
    priorities: bool = True  # tenants' priorities and fair shares order the queue
    # Where an interactive request may take the place of a batch one still waiting for its
    # first byte on one of `candidates` (gateway.backends.registry.Registry.displace); None: never.
    displace: Callable[[Iterable[Backend], int], Backend | None] | None = None
    # Whether a backend of the model is joining (found by discovery, its first probe due): a
    # request no backend can take now waits for it rather than failing; None: never.
    joining: Callable[[str], bool] | None = None


class Admission:
    def __init__(
        self,
        decide: Callable[[RouteRequest], Decision],
        changed: ChangeSignal,
        queueing: Queueing,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.decide, self.changed = decide, changed
        self.deadline_s, self.priorities = queueing.deadline_s, queueing.priorities
        self.displace, self.joining = queueing.displace, queueing.joining
        self.telemetry, self.clock = telemetry, clock

    async def admit(self, ex: Exchange) -> Decision:
        """The decision `ex` goes out with; a GatewayError (429, 503) when it cannot go."""
        req = ex.route_request()
        decision = self.decide(req) if ex.trace is None else ex.trace.route(self.decide, req)
        if decision.reason == Reason.SATURATED or ex.displaced or (
            not decision.candidates and self._awaits(ex, decision)
        ):
            # A displaced request waits its turn even where it sees room: the room is the one
            # it just gave up, for a request ahead of it in the queue.
            decision = await self._queue(ex, req, decision)
        ex.decision = decision
        if not decision.candidates:
            raise GatewayError(503, f"No healthy backend serves `{ex.model}`.",
                               headers=_RETRY_AFTER, reason=decision.reason)  # fmt: skip
        if decision.reason == Reason.SATURATED:
            raise GatewayError(429, "Every backend is saturated; retry later.",
                               headers=_RETRY_AFTER, reason=decision.reason)  # fmt: skip
        t = self.telemetry
        tier = decision.candidates[0].role
        t.add((t.decisions, decision.policy, decision.reason, tier))
        if decision.affinity:
            t.add((t.affinity, decision.affinity, tier))
        return decision

    def _awaits(self, ex: Exchange, decision: Decision) -> bool:
        """No backend can take it now, but one is joining (its first probe is due)."""
        return not decision.candidates and self.joining is not None and self.joining(ex.model)

    async def _queue(self, ex: Exchange, req: RouteRequest, decision: Decision) -> Decision:
        deadline = self.clock() + self.deadline_s
        # In line by its tenant's priority, and fairly among tenants (gateway.backends.registry).
        t = ex.tenant if self.priorities else None
        rank, tenant = (t.rank, t.name) if t is not None else (0, "")
        # An interactive request takes the place of a batch one still waiting for its first
        # byte on one of its candidates, rather than waiting itself.
        if self.displace is not None and t is not None:
            taken = self.displace(decision.candidates, rank)
            if taken is not None:
                rest = tuple(b for b in decision.candidates if b is not taken)
                return decision._replace(candidates=(taken, *rest), reason=Reason.DISPLACED)
        self.telemetry.queued.inc()
        try:
            woken = False
            if ex.displaced:
                ex.displaced = False
                woken = await self.changed.wait(max(0.0, deadline - self.clock()), rank=rank,
                                                tenant=tenant)  # fmt: skip
                decision = self.decide(req)
            while decision.reason == Reason.SATURATED or self._awaits(ex, decision):
                left = deadline - self.clock()
                if left <= 0:
                    break
                # Woken before and still no room: wait again at the front of the line.
                woken = await self.changed.wait(left, front=woken, rank=rank, tenant=tenant)
                decision = self.decide(req)
        finally:
            self.telemetry.queued.dec()
        return decision
