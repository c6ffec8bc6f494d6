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

Quiet: where `quiet` new keys in a row have come and none came again (prompts that never
repeat: a batch job, a benchmark), remembering each one is work for nothing, and so is
computing each one's key: from then on one request in `every` is keyed (`draw`), and of the
others only what may be a later turn (a chat with more than its opening, a prompt long enough
that its key is its beginning) is looked up (the intake decides: gateway.pipeline.intake), until
a remembered key comes again, which turns keying every request back on. A conversation that
starts while it is quiet is found at a later turn once one of its turns was remembered (one in
`every`); a short prompt's exact repeat only where that repeat is drawn too.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from gateway.core.exchange import Exchange

__all__ = ["Homes"]

log = logging.getLogger(__name__)

# An entry: [the URL of the backend that served the key last (None: none yet), when a request
# holding the key last began or ended, requests holding it in flight]. (A list: a begin and an
# end run on every keyed request, and a dataclass entry cost twice as much to build.)
_HOME, _SEEN, _BUSY = 0, 1, 2


class Homes:
    def __init__(
        self,
        capacity: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        quiet: tuple[int, int] = (0, 1),
        rng: random.Random | None = None,
    ) -> None:
        """`quiet`: (new keys in a row, none seen again, after which it is quiet (0: never);
        while it is, one new key in how many is remembered)."""
        self.capacity, self.ttl_s, self.clock = capacity, ttl_s, clock
        self.quiet, self.every = quiet
        self._chance, self._random = 1.0 / self.every, (rng or random.Random()).random
        # Whether every key is remembered (not quiet).
        self.everyone = True
        # Whether to key the request at hand (one with no declared session), read by the intake
        # with next(): True for every request, or while it is quiet one in `every`, drawn at
        # random (a count would pass over the same conversation at every turn where its turns
        # come in step with the others). An iterator of C parts (random() compared with the
        # chance): while not quiet, next() on it is all the check costs; while quiet, a draw
        # costs about what a method's did (docs/results/instructions-quiet-draw/costs.md).
        self._always: Iterator[bool] = itertools.repeat(True)
        self.draw: Iterator[bool] = self._always
        # New keys in a row since a key last came again.
        self._new_in_a_row = 0
        # Least recently used first. (An OrderedDict, not a dict popped and refilled: a dict
        # leaves a hole at the front for each key moved to its end, and finding its oldest key
        # then walks the holes: 80 us a request at capacity, against 3 here.)
        self._keys: OrderedDict[int, list[Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def _remember(self, key: int, entry: list[Any]) -> None:
        keys = self._keys
        keys[key] = entry
        if len(keys) > self.capacity:
            keys.popitem(last=False)

    def begin(self, ex: Exchange) -> None:
        """`ex` is about to be routed: set its home (None when its key is new, stale, or in use
        by another request now) and count it as holding its key."""
        key = ex.affinity
        if key is None:
            return
        now = self.clock()
        keys = self._keys
        entry = keys.get(key)
        if entry is None:  # (`_remember`, spelled out: a one-off prompt's key is new)
            keys[key] = [None, now, 1]
            if len(keys) > self.capacity:
                keys.popitem(last=False)
            self._new_in_a_row += 1
            if self._new_in_a_row == self.quiet:
                self.everyone = False
                # (random() is below 1: the sentinel never comes.)
                self.draw = map(self._chance.__gt__, iter(self._random, 2.0))
                log.info("prefix affinity: %d new prompts in a row, none seen again: one new key"
                         " in %d remembered until one comes again", self.quiet,
                         self.every)  # fmt: skip
            return
        if not self.everyone:
            log.info("prefix affinity: a remembered prompt came again: every key remembered")
        self._new_in_a_row, self.everyone, self.draw = 0, True, self._always
        keys.move_to_end(key)
        busy = entry[_BUSY]
        ex.home = None if busy or now - entry[_SEEN] > self.ttl_s else entry[_HOME]
        entry[_BUSY], entry[_SEEN] = busy + 1, now

    def end(self, ex: Exchange) -> None:
        """`ex` is over: the backend that answered it (if one did) becomes its key's home."""
        key = ex.affinity
        if key is None:
            return
        entry = self._keys.get(key)
        if entry is None:  # forgotten meanwhile (capacity): remembered again
            if ex.backend is None:
                return
            entry = [None, 0.0, 1]
            self._remember(key, entry)
        busy = entry[_BUSY]
        entry[_BUSY], entry[_SEEN] = busy - 1 if busy > 0 else 0, self.clock()
        if ex.backend is not None and ex.status < 400:
            entry[_HOME] = ex.backend.url
