"""In-process in-flight accounting: the default for a single gateway replica."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.backends.state.base import LocalCounts

__all__ = ["MemoryInflightStore"]


class MemoryInflightStore(LocalCounts):
    """One process, so the replica's own counts are the whole picture (the counts' own calls,
    not a wrapper's: a request takes and gives back a count and reads them all once)."""

    __slots__ = ()
    kind: Final = "memory"

    def counts(self) -> Mapping[str, int]:
        return self.snapshot()

    def local_counts(self) -> Mapping[str, int]:
        return self.snapshot()

    @property
    def healthy(self) -> bool:
        return True

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
