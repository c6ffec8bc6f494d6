"""In-flight accounting shared by several gateway replicas through Redis.

The hot path never touches the network: ``acquire``/``release`` change this replica's local
counts, and a background task publishes them as a whole every ``sync_interval_s`` and reads the
other replicas' counts back. Each replica's hash carries a lease (PEXPIRE), so a replica that dies
without cleaning up stops counting once its lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.typing import EncodableT, FieldT

from gateway.backends.state.base import LocalCounts

__all__ = ["RedisInflightStore"]

logger = logging.getLogger(__name__)


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def redact_url(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


class RedisInflightStore:
    """In-flight counts shared through Redis; see the module docstring for the protocol.

    ``replica_id`` names this gateway replica (default: hostname-pid-random); ``lease_ttl_s`` is
    how long a replica's counts outlive its last sync; ``key_prefix`` separates deployments that
    share one Redis.
    """

    kind: Final = "redis"

    def __init__(
        self,
        url: str,
        replica_id: str | None = None,
        sync_interval_s: float = 0.1,
        lease_ttl_s: float = 3.0,
        *,
        key_prefix: str = "tiergate",
    ) -> None:
        if sync_interval_s <= 0:
            raise ValueError("sync_interval_s must be > 0")
        if lease_ttl_s <= 2 * sync_interval_s:
            # Otherwise a live replica's lease could lapse between two of its own writes.
            raise ValueError("lease_ttl_s must be more than twice sync_interval_s")
        self._replica_id = replica_id or default_replica_id()
        self._interval = sync_interval_s
        self._lease_ttl_s = lease_ttl_s
        self._lease_ms = max(1, round(lease_ttl_s * 1000))
        # A tick must finish well inside the lease, or the lease lapses while we wait on Redis.
        self._op_timeout = min(1.0, lease_ttl_s / 3)
        self._key = f"{key_prefix}:inflight:{self._replica_id}"
        self._key_prefix = key_prefix
        self._replicas_key = f"{key_prefix}:replicas"
        self._url_for_logs = redact_url(url)
        # No client-side retries: the next tick is the retry, and a retrying client would stall
        # the sync loop during an outage.
        self._client = Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=self._op_timeout,
            socket_connect_timeout=self._op_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._local = LocalCounts()
        self._others: dict[str, int] = {}
        self._others_read_at = 0.0
        self._healthy = False
        self._in_outage = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def replica_id(self) -> str:
        return self._replica_id

    def acquire(self, backend: str) -> None:
        self._local.acquire(backend)

    def release(self, backend: str) -> None:
        self._local.release(backend)

    def try_acquire(self, backend: str, limit: int) -> bool:
        # Against the same view as counts(): the other replicas' counts are as old as the last
        # sync, so this is no stricter than the decision that came before it.
        return self._local.try_acquire(backend, limit - self._others.get(backend, 0))

    def counts(self) -> Mapping[str, int]:
        merged = self._local.snapshot()
        for backend, count in self._others.items():
            merged[backend] = merged.get(backend, 0) + count
        return merged

    def local_counts(self) -> Mapping[str, int]:
        return self._local.snapshot()

    @property
    def healthy(self) -> bool:
        return self._healthy

    async def start(self) -> None:
        if self._task is not None or self._closed:
            return
        # One sync before returning, so healthy and counts() are meaningful from the start;
        # an unreachable Redis is logged, not raised: the gateway serves on local counts.
        await self._tick()
        self._task = asyncio.create_task(self._run(), name=f"inflight-sync-{self._replica_id}")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            # Cancelling alone is not enough on Python 3.11: asyncio.wait_for (used inside
            # redis-py) can swallow a cancellation, so the loop also checks _closed.
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            async with asyncio.timeout(self._op_timeout):
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.delete(self._key)
                    pipe.zrem(self._replicas_key, self._replica_id)
                    await pipe.execute()
        except Exception as exc:
            # The lease cleans up after us anyway.
            logger.debug("in-flight store cleanup skipped: %s", exc)
        await self._client.aclose()
        self._healthy = False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            started = loop.time()
            await self._tick()
            if self._closed:
                return
            await asyncio.sleep(max(0.0, self._interval - (loop.time() - started)))

    async def _tick(self) -> None:
        try:
            async with asyncio.timeout(self._op_timeout):
                await self._sync_once()
        except Exception as exc:  # never let one bad tick end the sync loop
            self._on_failure(exc)
        else:
            self._on_success()

    async def _sync_once(self) -> None:
        local = self._local.snapshot()
        now = time.time()
        # DEL + HSET inside MULTI: readers see the whole new hash or the whole old one, and no
        # memory of previously written fields is needed (fields that dropped to zero just vanish,
        # and so does anything left by an earlier process with the same replica id).
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(self._key)
            if local:
                fields: dict[FieldT, EncodableT] = {k: v for k, v in local.items()}
                pipe.hset(self._key, mapping=fields)
                pipe.pexpire(self._key, self._lease_ms)
            pipe.zadd(self._replicas_key, {self._replica_id: now})
            # The sorted set is only an index (liveness is the hash's lease); scores use each
            # replica's own clock, so forget members only well past a lease to tolerate skew.
            pipe.zremrangebyscore(self._replicas_key, "-inf", now - 2 * self._lease_ttl_s)
            pipe.zrange(self._replicas_key, 0, -1)
            results = await pipe.execute()
        others = [member for member in results[-1] if member != self._replica_id]
        hashes: list[dict[str, str]] = []
        if others:
            async with self._client.pipeline(transaction=False) as pipe:
                for member in others:
                    pipe.hgetall(f"{self._key_prefix}:inflight:{member}")
                hashes = await pipe.execute()
        self._others = self._aggregate(hashes)
        self._others_read_at = time.monotonic()

    @staticmethod
    def _aggregate(hashes: list[dict[str, str]]) -> dict[str, int]:
        # A missing hash (empty dict) is a replica with nothing in flight or an expired lease.
        total: dict[str, int] = {}
        for fields in hashes:
            for backend, raw in fields.items():
                try:
                    count = int(raw)
                except ValueError:
                    logger.debug("ignoring malformed in-flight count %r for %r", raw, backend)
                    continue
                if count > 0:
                    total[backend] = total.get(backend, 0) + count
        return total

    def _on_success(self) -> None:
        if self._in_outage:
            logger.info("in-flight store: Redis at %s reachable again", self._url_for_logs)
            self._in_outage = False
        self._healthy = True

    def _on_failure(self, exc: BaseException) -> None:
        self._healthy = False
        if not self._in_outage:
            self._in_outage = True
            logger.warning(
                "in-flight store: Redis at %s unavailable (%s: %s); serving local counts"
                " until it is back",
                self._url_for_logs,
                type(exc).__name__,
                exc,
            )
        # Other replicas' counts are as good as their leases: past that, forget them.
        if time.monotonic() - self._others_read_at > self._lease_ttl_s:
            self._others = {}
