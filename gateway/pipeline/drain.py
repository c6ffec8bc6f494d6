"""The gateway's shutdown state, shared by the app and its runner (gateway.serve.server).

The app reads `draining` (/ready answers 503 from the first signal on) and keeps `live`: each
proxied exchange and the task serving it, from arrival to its last byte. The runner waits for
`live` to empty, and past the drain deadline ends what is left with `cut`: each exchange gets a
`cut_reason` and its task is cancelled, which upstream turns into a clean end (a 503 before the
first byte, an SSE error event and [DONE] in a stream) and the proxy into a 503 while the
request is still being read or queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gateway.core.exchange import Exchange

__all__ = ["Drain"]

_POLL_S = 0.05


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self.since: float | None = None  # monotonic time of the first signal
        # Insertion and removal per request are the only cost on the request path.
        self.live: dict[Exchange, asyncio.Task[Any]] = {}

    def begin(self) -> None:
        if not self.draining:
            self.draining, self.since = True, time.monotonic()

    async def settle(self, timeout_s: float, hurry: asyncio.Event) -> bool:
        """Wait until no exchange is live, at most `timeout_s` or until `hurry` is set; True
        when none is left. (Polled: the request path pays nothing for it.)"""
        deadline = time.monotonic() + timeout_s
        while self.live and not hurry.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hurry.wait(), min(_POLL_S, left))
        return not self.live

    def cut(self, reason: str) -> int:
        """End every live exchange now, cleanly, saying `reason`; how many there were."""
        live = list(self.live.items())
        for ex, task in live:
            if ex.cut_reason is None:
                ex.cut_reason = reason
                task.cancel()
        return len(live)
