"""Shadow mode of gray releases: a copy of a request goes to another variant and its answer is
thrown away, so a new version meets real traffic, in its metrics, before any client sees it.

A copy is sent at once, beside the request it copies (as Envoy's request mirroring does),
through the same routing and upstream path (retries, ejection, the learner's curves: the copy
is real load on real engines) but never queued: with no room it is dropped, and counted. Copies
in flight are bounded; past the bound new ones are dropped too, so a slow new version cannot
pile up work in the gateway. The client's request never waits for its copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from gateway.core.exchange import Exchange, body_of
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.upstream import Upstream
from gateway.routing import Decision, Reason, RouteRequest

__all__ = ["Shadow"]

log = logging.getLogger(__name__)

# Hop-by-hop and per-request headers the copy must not carry.
_DROPPED = frozenset({b"content-length", b"x-request-id", b"traceparent", b"tracestate"})


async def _discard(message: MutableMapping[str, Any]) -> None:
    return None


class Shadow:
    def __init__(
        self,
        decide: Callable[[RouteRequest], Decision],
        upstream: Upstream,
        telemetry: Telemetry,
        limit: int = 64,
    ) -> None:
        self.decide, self.upstream, self.telemetry, self.limit = decide, upstream, telemetry, limit
        self.tasks: set[asyncio.Task[None]] = set()

    def mirror(self, ex: Exchange, new_id: str) -> None:
        """Send a copy of `ex` to `ex.mirror`, in the background."""
        variant = ex.mirror
        assert variant is not None
        if len(self.tasks) >= self.limit:
            self.telemetry.child(self.telemetry.shadow_dropped, variant.release, variant.name,
                                 "busy").inc()  # fmt: skip
            return
        headers = {k: v for k, v in ex.headers.items() if k not in _DROPPED}
        copy = Exchange(new_id, ex.endpoint, headers, _discard, time.perf_counter())
        copy.data = {**ex.data, "model": variant.model}
        copy.body = body_of(copy.data) if variant.model != ex.model else ex.body
        copy.model, copy.stream, copy.slo = variant.model, ex.stream, ex.slo
        copy.exclude, copy.affinity = ex.exclude, ex.affinity
        copy.variant, copy.shadow = variant, True
        task = asyncio.get_running_loop().create_task(self._run(copy))
        copy.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, ex: Exchange) -> None:
        variant = ex.variant
        assert variant is not None
        decision = self.decide(ex.route_request())
        if not decision.candidates or decision.reason == Reason.SATURATED:
            self.telemetry.child(self.telemetry.shadow_dropped, variant.release, variant.name,
                                 "no_room").inc()  # fmt: skip
            return
        ex.decision = decision
        try:
            sent = await self.upstream.forward(ex, decision)
        except Exception:
            log.exception("shadow copy failed", extra={"fields": {"request_id": ex.id}})
            ex.status = ex.status or 500
            sent = True
        if not sent:  # every candidate filled up since the decision
            self.telemetry.child(self.telemetry.shadow_dropped, variant.release, variant.name,
                                 "no_room").inc()  # fmt: skip
            return
        self.telemetry.record_variant(ex, time.perf_counter() - ex.started)

    async def aclose(self) -> None:
        """Cancel the copies still running (the gateway is stopping)."""
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=5)
