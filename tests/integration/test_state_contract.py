"""One contract for every InflightStore, plus what only the Redis store promises."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import pytest
import redis.asyncio as aioredis

from gateway.backends.state import (
    InflightStore,
    MemoryInflightStore,
    SharedInflightStore,
    SharedTable,
    make_store,
)
from gateway.backends.state.redis import RedisInflightStore, redact_url
from tests.conftest import free_port

if TYPE_CHECKING:
    from tests.conftest import RedisProcess

LOGGER = "gateway.backends.state.redis"


async def eventually(check: Callable[[], bool], within: float = 1.0, what: str = "") -> float:
    """Poll ``check`` until it holds; return the seconds it took. Fails at the deadline."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not check():
        if loop.time() - started > within:
            raise AssertionError(f"not within {within}s: {what or check}")
        await asyncio.sleep(0.01)
    return loop.time() - started


def prefix() -> str:
    # Every test gets its own key space on the shared server.
    return f"test-{uuid.uuid4().hex[:8]}"


# The backends the contract's tests name: the shared store's table is laid out at its start.
NAMES = ("a", "b", "x", "never-acquired", *(f"b{i}" for i in range(5)))


@pytest.fixture(params=["memory", "shared", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[InflightStore]:
    instance: InflightStore
    table: SharedTable | None = None
    if request.param == "memory":
        instance = MemoryInflightStore()
    elif request.param == "shared":
        table = SharedTable.create(NAMES, workers=2)
        instance = SharedInflightStore(table, 1)
    else:
        url = request.getfixturevalue("redis_server")
        instance = RedisInflightStore(
            url, sync_interval_s=0.05, lease_ttl_s=1.0, key_prefix=prefix()
        )
    await instance.start()
    try:
        yield instance
    finally:
        await instance.aclose()
        if table is not None:
            table.unlink()


# --- the contract ----------------------------------------------------------------------------


async def test_satisfies_protocol_and_starts_empty(store: InflightStore) -> None:
    assert isinstance(store, InflightStore)
    assert store.healthy
    assert dict(store.counts()) == {}
    assert dict(store.local_counts()) == {}


async def test_acquire_release_counts(store: InflightStore) -> None:
    store.acquire("a")
    store.acquire("a")
    store.acquire("b")
    assert dict(store.local_counts()) == {"a": 2, "b": 1}
    assert dict(store.counts()) == {"a": 2, "b": 1}
    store.release("a")
    assert store.counts().get("a", 0) == 1
    store.release("a")
    store.release("b")
    assert store.counts().get("a", 0) == 0
    assert store.counts().get("b", 0) == 0
    assert all(v == 0 for v in store.counts().values())


async def test_never_negative(store: InflightStore) -> None:
    store.release("never-acquired")
    assert store.counts().get("never-acquired", 0) == 0
    store.acquire("x")
    store.release("x")
    store.release("x")  # one release too many
    store.release("x")
    assert store.local_counts().get("x", 0) == 0
    store.acquire("x")
    assert store.counts().get("x", 0) == 1  # the extra releases were not banked
    assert all(v >= 0 for v in store.counts().values())


async def test_counts_reflect_interleaved_traffic(store: InflightStore) -> None:
    backends = [f"b{i}" for i in range(5)]
    for round_ in range(200):
        store.acquire(backends[round_ % 5])
    for round_ in range(150):
        store.release(backends[round_ % 5])
    assert dict(store.counts()) == {name: 10 for name in backends}


async def test_counts_are_snapshots(store: InflightStore) -> None:
    store.acquire("a")
    before = store.counts()
    store.acquire("a")
    assert before.get("a") == 1
    assert store.counts().get("a") == 2


async def test_try_acquire_stops_at_the_limit(store: InflightStore) -> None:
    assert store.try_acquire("a", 2)
    assert store.try_acquire("a", 2)
    assert not store.try_acquire("a", 2)
    assert store.counts().get("a") == 2  # the refusal counted nothing
    store.release("a")
    assert store.try_acquire("a", 2)
    store.acquire("a")  # a plain acquire is not capped
    assert store.counts().get("a") == 3
    assert not store.try_acquire("a", 3)


async def test_aclose_is_idempotent(store: InflightStore) -> None:
    await store.aclose()
    await store.aclose()


# --- Redis only ------------------------------------------------------------------------------

StoreFactory = Callable[..., RedisInflightStore]


@pytest.fixture
async def make_redis_store() -> AsyncIterator[StoreFactory]:
    """Build RedisInflightStores (not started); every one is closed at teardown."""
    made: list[RedisInflightStore] = []

    def make(url: str, **kwargs: object) -> RedisInflightStore:
        instance = RedisInflightStore(url, **kwargs)  # type: ignore[arg-type]
        made.append(instance)
        return instance

    yield make
    for instance in made:
        await instance.aclose()


async def test_own_counts_written_once_and_not_double_counted(
    redis_server: str, make_redis_store: StoreFactory
) -> None:
    keys = prefix()
    store = make_redis_store(redis_server, replica_id="solo", key_prefix=keys)
    await store.start()
    store.acquire("a")
    store.acquire("a")
    client = aioredis.Redis.from_url(redis_server, decode_responses=True)
    try:
        for _ in range(100):
            if await client.hgetall(f"{keys}:inflight:solo") == {"a": "2"}:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the replica's hash never reached Redis")
        assert await client.zrange(f"{keys}:replicas", 0, -1) == ["solo"]
        ttl_ms = await client.pttl(f"{keys}:inflight:solo")
        assert 0 < ttl_ms <= 3000  # a lease, not a permanent key
        # A couple more sync ticks read the replica set (its own id in it) back: two reads of
        # the other replicas' counts after the hash was seen in Redis.
        seen_at = time.monotonic()
        reads: set[float] = set()

        def two_more_ticks() -> bool:
            if store._others_read_at > seen_at:
                reads.add(store._others_read_at)
            return len(reads) >= 2

        await eventually(two_more_ticks, 10.0, "two more sync ticks")
        assert dict(store.counts()) == {"a": 2}

        store.release("a")
        store.release("a")
        for _ in range(100):
            if not await client.exists(f"{keys}:inflight:solo"):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("zeroed fields were not removed")

        store.acquire("b")
        await store.aclose()
        assert not await client.exists(f"{keys}:inflight:solo")
        assert await client.zrange(f"{keys}:replicas", 0, -1) == []
    finally:
        await client.aclose()


async def test_replicas_see_each_other(redis_server: str, make_redis_store: StoreFactory) -> None:
    keys = prefix()
    a = make_redis_store(redis_server, replica_id="a", key_prefix=keys)
    b = make_redis_store(redis_server, replica_id="b", key_prefix=keys)
    await a.start()
    await b.start()
    for _ in range(3):
        a.acquire("x")
    b.acquire("x")
    b.acquire("x")
    b.acquire("y")

    expected = {"x": 5, "y": 1}
    await eventually(lambda: dict(a.counts()) == expected, 1.0, "a sees b")
    await eventually(lambda: dict(b.counts()) == expected, 1.0, "b sees a")
    assert dict(a.local_counts()) == {"x": 3}
    assert dict(b.local_counts()) == {"x": 2, "y": 1}

    b.release("x")
    b.release("y")
    await eventually(lambda: dict(a.counts()) == {"x": 4}, 1.0, "a sees b's releases")

    await b.aclose()
    await eventually(lambda: dict(a.counts()) == {"x": 3}, 1.0, "b gone after aclose")


async def test_crashed_replica_expires_with_its_lease(
    redis_server: str, make_redis_store: StoreFactory
) -> None:
    keys = prefix()
    survivor = make_redis_store(redis_server, replica_id="survivor", key_prefix=keys)
    doomed = make_redis_store(redis_server, replica_id="doomed", lease_ttl_s=1.0, key_prefix=keys)
    await survivor.start()
    await doomed.start()
    doomed.acquire("x")
    doomed.acquire("x")
    await eventually(lambda: survivor.counts().get("x") == 2, 1.0, "survivor sees doomed")

    # Crash: the sync task stops and nothing is cleaned up (no DEL, no ZREM).
    task = doomed._task
    assert task is not None
    doomed._closed = True  # stops the loop, and the teardown's aclose() becomes a no-op
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await doomed._client.aclose()

    waited = await eventually(
        lambda: survivor.counts().get("x", 0) == 0, 3.0, "doomed's lease expired"
    )
    # Gone because the lease ran out, not sooner.
    assert waited > 0.5
    assert survivor.healthy


async def test_outage_serves_local_counts_and_recovers(
    redis_process: RedisProcess, make_redis_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    url = redis_process.url
    a = make_redis_store(url, replica_id="a", sync_interval_s=0.05, lease_ttl_s=1.0)
    b = make_redis_store(url, replica_id="b", sync_interval_s=0.05, lease_ttl_s=1.0)
    await a.start()
    await b.start()
    a.acquire("local")
    b.acquire("remote")
    await eventually(lambda: dict(a.counts()) == {"local": 1, "remote": 1}, 1.0, "a sees b")

    redis_process.stop()
    await eventually(lambda: not a.healthy, 2.0, "a notices the outage")
    # The hot path keeps working while Redis is down.
    a.acquire("local")
    a.release("local")
    # b's counts are dropped once they are older than a lease: a serves on its own counts.
    await eventually(lambda: dict(a.counts()) == {"local": 1}, 3.0, "a falls back to local")
    assert dict(a.local_counts()) == {"local": 1}
    assert not a.healthy
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # once per store per outage, not once per tick

    redis_process.start()
    await eventually(lambda: a.healthy and b.healthy, 3.0, "both reconnect")
    await eventually(lambda: dict(a.counts()) == {"local": 1, "remote": 1}, 1.0, "a sees b again")
    infos = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]
    assert any("reachable again" in r.getMessage() for r in infos)


async def test_start_without_redis_does_not_raise(
    make_redis_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    store = make_redis_store(url)
    await store.start()
    assert not store.healthy
    store.acquire("a")
    assert dict(store.counts()) == {"a": 1}
    store.release("a")
    assert any("unavailable" in r.getMessage() for r in caplog.records)
    assert "hunter2" not in caplog.text
    await store.aclose()


def test_redact_url() -> None:
    assert redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


def test_rejects_lease_shorter_than_two_ticks() -> None:
    with pytest.raises(ValueError, match="lease_ttl_s"):
        RedisInflightStore("redis://127.0.0.1:1/0", sync_interval_s=1.0, lease_ttl_s=1.5)


async def test_make_store() -> None:
    assert isinstance(make_store(None), MemoryInflightStore)
    assert isinstance(make_store(""), MemoryInflightStore)
    store = make_store("redis://127.0.0.1:1/0")  # nothing connects until start()
    assert isinstance(store, RedisInflightStore)
    await store.aclose()
    table = SharedTable.create(["a"], workers=2)
    try:
        assert isinstance(make_store(None, (table, 0)), SharedInflightStore)
        # With Redis configured, each worker is one more replica of the Redis store.
        store = make_store("redis://127.0.0.1:1/0", (table, 0))
        assert isinstance(store, RedisInflightStore)
        await store.aclose()
    finally:
        table.unlink()
