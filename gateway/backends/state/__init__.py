"""In-flight request accounting: in-process, shared by the workers of one host through shared
memory, or shared between gateway replicas via Redis (`gateway.backends.state.redis`)."""

from __future__ import annotations

from gateway.backends.state.base import InflightStore
from gateway.backends.state.memory import MemoryInflightStore
from gateway.backends.state.shared import SharedInflightStore, SharedTable

__all__ = [
    "InflightStore",
    "MemoryInflightStore",
    "SharedInflightStore",
    "SharedTable",
    "make_store",
]


def make_store(
    redis_url: str | None, shared: tuple[SharedTable, int] | None = None
) -> InflightStore:
    """Redis-backed store when a URL is configured; else worker `shared[1]`'s view of the table
    `shared[0]` when the gateway runs as several workers; else the in-process one."""
    if redis_url:
        # Imported only then: the redis client takes a quarter of the gateway's start-up.
        from gateway.backends.state.redis import RedisInflightStore

        return RedisInflightStore(redis_url)
    if shared is not None:
        return SharedInflightStore(*shared)
    return MemoryInflightStore()
