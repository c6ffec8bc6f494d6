"""The stream watchdog: a stream whose engine has sent nothing for `stream_idle_timeout_s`
after its first byte is cut, and counts as its backend's failure (gateway.backends.outlier), so a
frozen engine cannot leave its clients waiting until `request_timeout_s`.

One sweep over the streams in flight every quarter of the timeout (0.25 s at most) instead of a
timer per chunk: the relay only notes the time of each chunk on its lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.backends.registry import Registry

__all__ = ["StreamWatchdog"]

log = logging.getLogger(__name__)


class StreamWatchdog:
    def __init__(self, registry: Registry, idle_s: float, clock: Callable[[], float]) -> None:
        self.registry, self.idle_s, self.clock = registry, idle_s, clock
        self.period_s = min(0.25, idle_s / 4)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="stream-watchdog")

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def sweep(self) -> int:
        cut = self.registry.cut_idle(self.clock(), self.idle_s)
        if cut:
            log.warning("silent streams cut", extra={"fields": {
                "streams": cut, "idle_s": self.idle_s}})  # fmt: skip
        return cut

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                self.sweep()
            except Exception:  # the watchdog must outlive any one bad sweep
                log.exception("stream watchdog sweep failed")
