"""Where each affinity key was served last: the memory behind prefix-cache affinity
(gateway.routing.affinity), and which keys are in use right now.

A key becomes a request's `home` only when it was served lately and no other request holding it
is in flight. A conversation's turns come one after another, each after the previous answer; a
prefix that requests share at once (a few-shot preamble, a benchmark's one prompt, the same
opening in many chats) is cached on every instance it has been sent to, and sending all of it to
one of them would only trade the policy's balance for nothing: those go by the policy.

Bounded and decaying: at most `capacity` keys, the least recently used forgotten first, and a
key not seen for `ttl_s` is forgotten (the engine has most likely evicted its blocks by then).
Per process: with several workers, each remembers what it served (a first-seen session still
goes to its own backend by hashing, the same in every worker).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gateway.core.exchange import Exchange

__all__ = ["Homes"]


@dataclass(slots=True)
class _Entry:
    home: str | None  # the URL of the backend that served the key last
    seen: float  # when a request holding it last began or ended
    busy: int  # requests holding it in flight


class Homes:
    def __init__(
        self, capacity: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity, self.ttl_s, self.clock = capacity, ttl_s, clock
        self._keys: OrderedDict[int, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def begin(self, ex: Exchange) -> None:
        """`ex` is about to be routed: set its home (None when its key is new, stale, or in use
        by another request now) and count it as holding its key."""
        key = ex.affinity
        if key is None:
            return
        now = self.clock()
        keys = self._keys
        entry = keys.get(key)
        if entry is None:
            keys[key] = _Entry(None, now, 1)
            if len(keys) > self.capacity:
                keys.popitem(last=False)
            return
        keys.move_to_end(key)
        if entry.busy or now - entry.seen > self.ttl_s:
            ex.home = None
        else:
            ex.home = entry.home
        entry.busy += 1
        entry.seen = now

    def end(self, ex: Exchange) -> None:
        """`ex` is over: the backend that answered it (if one did) becomes its key's home."""
        key = ex.affinity
        if key is None:
            return
        entry = self._keys.get(key)
        if entry is None:  # forgotten meanwhile (capacity): remembered again
            if ex.backend is None:
                return
            entry = self._keys[key] = _Entry(None, 0.0, 1)
            if len(self._keys) > self.capacity:
                self._keys.popitem(last=False)
        entry.busy = max(0, entry.busy - 1)
        entry.seen = self.clock()
        if ex.backend is not None and ex.status < 400:
            entry.home = ex.backend.url
