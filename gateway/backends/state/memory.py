"""In-process in-flight accounting: the default for a single gateway replica."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.backends.state.base import LocalCounts

__all__ = ["MemoryInflightStore"]


class MemoryInflightStore:
    """One process, so the replica's own counts are the whole picture."""

    kind: Final = "memory"

    def __init__(self) -> None:
        self._local = LocalCounts()

    def acquire(self, backend: str) -> None:
        self._local.acquire(backend)

    def release(self, backend: str) -> None:
        self._local.release(backend)

    def try_acquire(self, backend: str, limit: int) -> bool:
        return self._local.try_acquire(backend, limit)

    def counts(self) -> Mapping[str, int]:
        return self._local.snapshot()

    def local_counts(self) -> Mapping[str, int]:
        return self._local.snapshot()

    @property
    def healthy(self) -> bool:
        return True

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
