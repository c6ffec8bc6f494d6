"""The in-flight accounting interface the router and monitor depend on."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

__all__ = ["InflightStore", "LocalCounts", "StoreKind"]

StoreKind = Literal["memory", "shared", "redis"]

logger = logging.getLogger(__name__)


@runtime_checkable
class InflightStore(Protocol):
    """Requests in flight through the gateway, per backend.

    ``acquire``/``release`` sit on the request hot path: synchronous, O(1), never waiting on the
    network. ``counts`` is served from memory. Backends with nothing in flight may be absent from
    the mappings, so read them with ``.get(backend, 0)``.
    """

    @property
    def kind(self) -> StoreKind:
        """What shares the counts: this process, this host's workers, or Redis."""
        ...

    def acquire(self, backend: str) -> None: ...

    def release(self, backend: str) -> None: ...

    def try_acquire(self, backend: str, limit: int) -> bool:
        """Acquire only while fewer than `limit` requests are in flight there, as this store
        sees it; False (nothing acquired) otherwise. Strict across the processes that share
        the store's counts exactly (the shared-memory store), as strict as ``counts`` otherwise.
        """
        ...

    def counts(self) -> Mapping[str, int]:
        """Best current view across all gateway replicas (a snapshot, not a live view)."""
        ...

    def local_counts(self) -> Mapping[str, int]:
        """This replica's own in-flight requests (a snapshot)."""
        ...

    @property
    def healthy(self) -> bool:
        """False while a shared backing store is unreachable (counts are then local only)."""
        ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class LocalCounts:
    """Per-backend counters that never go negative; zeroed entries are dropped."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def acquire(self, backend: str) -> None:
        self._counts[backend] = self._counts.get(backend, 0) + 1

    def try_acquire(self, backend: str, limit: int) -> bool:
        if self._counts.get(backend, 0) >= limit:
            return False
        self.acquire(backend)
        return True

    def release(self, backend: str) -> None:
        current = self._counts.get(backend, 0)
        if current <= 0:
            # An unmatched release is a caller bug, but must not corrupt the counts the router uses.
            logger.debug("release of %r with nothing in flight ignored", backend)
            return
        if current == 1:
            del self._counts[backend]
        else:
            self._counts[backend] = current - 1

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)
