"""In-flight request accounting: in-process, or shared between gateway replicas via Redis."""

from __future__ import annotations

from gateway.state.base import InflightStore
from gateway.state.memory import MemoryInflightStore
from gateway.state.redis import RedisInflightStore

__all__ = ["InflightStore", "MemoryInflightStore", "RedisInflightStore", "make_store"]


def make_store(redis_url: str | None) -> InflightStore:
    """Redis-backed store when a URL is configured, else the in-process one."""
    if redis_url:
        return RedisInflightStore(redis_url)
    return MemoryInflightStore()
