"""The backend registry: leases that cannot leak, ejection, the snapshot routing reads."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.registry import ChangeSignal, Registry
from gateway.routing import Role
from gateway.settings import Settings
from gateway.state import MemoryInflightStore
from gateway.telemetry import Telemetry

LAT, T1, T2, TRITON = "http://lat:1", "http://t1:1", "http://t2:1", "http://tr:1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock | None = None, **monitor: Any) -> Registry:
    pool = [{"url": T1, "models": ["m"]}, {"url": T2, "models": ["m", "other"]},
            {"url": TRITON, "models": ["m"], "kind": "triton"}]  # fmt: skip
    settings = Settings(
        tiers=[
            {"name": "eagle", "role": "latency", "backends": [{"url": LAT, "models": ["m"]}]},
            {"name": "awq", "role": "throughput", "backends": pool},
        ],
        monitor={"scrape_interval_s": 0.25, "eject_after_failures": 3, **monitor},
    )
    return Registry(settings, MemoryInflightStore(), Telemetry(), clock or Clock())


def gauge(reg: Registry, url: str) -> float:
    value: float = reg.entry(url).inflight_gauge._value.get()
    return value


# -- leases ------------------------------------------------------------------------------------


async def _held(reg: Registry, url: str, release: asyncio.Event, how: str) -> None:
    with reg.lease(reg.entry(url)):
        await release.wait()
        if how == "raise":
            raise RuntimeError("boom")


@pytest.mark.parametrize("how", ["return", "raise", "cancel"])
async def test_a_lease_is_given_back_on_every_exit(how: str) -> None:
    reg = registry()
    release = asyncio.Event()
    tasks = [asyncio.create_task(_held(reg, T1, release, how)) for _ in range(3)]
    await asyncio.sleep(0)
    assert reg.store.counts() == {T1: 3}
    assert gauge(reg, T1) == 3
    assert len(reg.entry(T1).waiting) == 3
    if how == "cancel":
        for t in tasks:
            t.cancel()
    else:
        release.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert reg.store.counts() == {}
    assert gauge(reg, T1) == 0
    assert reg.entry(T1).waiting == set()


async def test_giving_a_lease_back_wakes_the_longest_waiter_for_capacity() -> None:
    reg = registry()
    first = asyncio.create_task(reg.changed.wait(5.0))
    await asyncio.sleep(0)
    second = asyncio.create_task(reg.changed.wait(5.0))
    await asyncio.sleep(0)
    with reg.lease(reg.entry(T1)):
        await asyncio.sleep(0)
        assert not first.done()
    assert await asyncio.wait_for(first, 1.0) is True
    assert not second.done()  # one slot freed: one waiter woken
    second.cancel()


async def test_exiting_a_lease_twice_releases_once() -> None:
    reg = registry()
    lease = reg.lease(reg.entry(T1))
    with lease:
        with reg.lease(reg.entry(T1)):
            pass
        lease.__exit__(None, None, None)
        assert reg.store.counts() == {}
    assert reg.store.counts() == {}


# -- ejection ----------------------------------------------------------------------------------


async def test_ejection_moves_the_attempts_still_waiting_for_a_first_byte() -> None:
    reg = registry()
    entry = reg.entry(T1)
    outcome: dict[str, str] = {}
    answered = asyncio.Event()

    async def attempt(name: str, first_byte: bool) -> None:
        with reg.lease(entry) as lease:
            if first_byte:
                lease.first_byte()
            try:
                await answered.wait()
                outcome[name] = "finished"
            except asyncio.CancelledError:
                outcome[name] = "moved on" if lease.ejected else "cancelled"
                raise

    waiting = asyncio.create_task(attempt("waiting", first_byte=False))
    streaming = asyncio.create_task(attempt("streaming", first_byte=True))
    await asyncio.sleep(0)
    reg.eject(entry, "stalled")
    answered.set()
    await asyncio.gather(waiting, streaming, return_exceptions=True)
    assert outcome == {"waiting": "moved on", "streaming": "finished"}
    assert reg.store.counts() == {}
    assert entry.live.ejected
    assert entry.live.eject_reason == "stalled"


async def test_the_attempt_whose_failure_ejects_is_not_cancelled() -> None:
    reg = registry()
    entry = reg.entry(T1)
    with reg.lease(entry) as lease:
        for _ in range(3):
            reg.request_failed(entry, "connect")
        assert entry.live.eject_reason == "requests_connect"
        assert not lease.ejected
        await asyncio.sleep(0)  # not cancelled: this would raise


@pytest.mark.parametrize(
    ("events", "ejected"),
    [
        (["fail", "fail"], False),
        (["fail", "fail", "fail"], True),
        (["fail", "fail", "ok", "fail", "fail"], False),
        (["fail", "ok", "fail", "fail", "fail"], True),
    ],
)
def test_consecutive_request_failures_eject(events: list[str], ejected: bool) -> None:
    reg = registry()
    entry = reg.entry(T2)
    for e in events:
        if e == "fail":
            reg.request_failed(entry, "http_503")
        else:
            reg.request_succeeded(entry)
    assert entry.live.ejected is ejected
    assert not reg.entry(T1).live.ejected


def test_readmission_clears_the_failures_and_wakes_waiters() -> None:
    reg = registry()
    entry = reg.entry(T1)
    for _ in range(3):
        reg.request_failed(entry, "connect")
    assert T1 not in {b for b, load in reg.snapshot().loads.items() if load.healthy}
    reg.readmit(entry)
    assert reg.snapshot().load(T1).healthy
    assert entry.live.request_failures == 0


# -- the snapshot ------------------------------------------------------------------------------


def test_snapshot_merges_scraped_load_in_flight_counts_and_staleness() -> None:
    clock = Clock()
    reg = registry(clock)
    assert reg.snapshot().load(T1).stale  # never scraped
    st = reg.entry(T1).live
    st.running, st.waiting, st.scraped_at = 5, 2, clock.now
    reg.store.acquire(T1)
    load = reg.snapshot().load(T1)
    assert (load.running, load.waiting, load.inflight, load.stale) == (5, 2, 1, False)
    assert load.effective == 7
    clock.now += 0.8  # more than 3 scrape intervals
    load = reg.snapshot().load(T1)
    assert load.stale
    assert load.effective == 1  # only the gateway's own count is trusted then
    assert reg.snapshot().taken_at == clock.now


def test_who_serves_what_and_which_kinds_restrict() -> None:
    reg = registry()
    assert reg.models == frozenset({"m", "other"})
    assert reg.serving("m", None) == {LAT, T1, T2, TRITON}
    assert reg.serving("m", Role.LATENCY) == {LAT}
    assert reg.serving("other", Role.LATENCY) == frozenset()
    assert reg.serving("other", Role.THROUGHPUT) == {T2}
    assert [(a.kind, urls) for a, urls in reg.restricted] == [("triton", frozenset({TRITON}))]
    assert reg.entry(TRITON).health_url == TRITON + "/v2/health/ready"
    assert reg.entry(T1).health_url == T1 + "/health"
    assert reg.entry(T1).metrics_url == T1 + "/metrics"


def test_healthy_models_leave_out_ejected_backends() -> None:
    reg = registry()
    reg.eject(reg.entry(T2), "stalled")
    assert reg.healthy_models() == {"m"}


# -- the change signal -------------------------------------------------------------------------


async def test_change_signal_wakes_every_waiter_once() -> None:
    signal = ChangeSignal()
    waiters = [asyncio.create_task(signal.wait(5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    assert signal.waiting == 3
    signal.notify()
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert signal.waiting == 0


async def test_notify_one_wakes_in_order_and_a_rewait_at_the_front_keeps_its_place() -> None:
    signal = ChangeSignal()
    woken: list[str] = []

    async def waiter(name: str, front: bool = False) -> None:
        await signal.wait(5.0, front=front)
        woken.append(name)

    a = asyncio.create_task(waiter("a"))
    await asyncio.sleep(0)
    b = asyncio.create_task(waiter("b"))
    await asyncio.sleep(0)
    signal.notify_one()
    await a
    again = asyncio.create_task(waiter("a again", front=True))  # woken, no room: waits first
    await asyncio.sleep(0)
    signal.notify_one()
    await again
    signal.notify_one()
    await b
    assert woken == ["a", "a again", "b"]


async def test_a_waiter_woken_then_cancelled_passes_the_room_on() -> None:
    signal = ChangeSignal()
    first = asyncio.create_task(signal.wait(5.0))
    await asyncio.sleep(0)
    second = asyncio.create_task(signal.wait(5.0))
    await asyncio.sleep(0)
    signal.notify_one()
    first.cancel()  # its client went away before it could use the room
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1.0) is True


async def test_change_signal_times_out_and_forgets_the_waiter() -> None:
    signal = ChangeSignal()
    assert await signal.wait(0.01) is False
    assert signal.waiting == 0
    signal.notify()  # nobody left to wake: a no-op
