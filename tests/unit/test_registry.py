"""The backend registry: leases that cannot leak, ejection, the snapshot routing reads."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from gateway.backends.registry import CLASS_MEMORY_S, ChangeSignal, Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.observe.telemetry import Telemetry
from gateway.routing import Role

LAT, T1, T2, TRITON = "http://lat:1", "http://t1:1", "http://t2:1", "http://tr:1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock | None = None, **outlier: Any) -> Registry:
    pool = [{"url": T1, "models": ["m"]}, {"url": T2, "models": ["m", "other"]},
            {"url": TRITON, "models": ["m"], "kind": "triton"}]  # fmt: skip
    settings = Settings(
        tiers=[
            {"name": "eagle", "role": "latency", "backends": [{"url": LAT, "models": ["m"]}]},
            {"name": "awq", "role": "throughput", "backends": pool},
        ],
        monitor={"scrape_interval_s": 0.25},
        outlier={"consecutive_failures": 3, "base_ejection_s": 5, "max_ejection_s": 60,
                 "trial_successes": 3, **outlier},
    )  # fmt: skip
    return Registry(settings, MemoryInflightStore(), Telemetry(), clock or Clock())


def gauge(reg: Registry, url: str) -> float:
    reg.telemetry.flush()
    value: float = reg.telemetry.child(*reg.entry(url).inflight)._value.get()
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


def _cancel_me() -> Callable[[], None]:
    """What cuts a stream in these tests: the task is cancelled (the relay's read would fail)."""
    me = asyncio.current_task()
    assert me is not None

    def cut() -> None:
        me.cancel()

    return cut


# -- ejection ----------------------------------------------------------------------------------


async def test_ejection_moves_the_attempts_waiting_for_a_first_byte_and_cuts_streams() -> None:
    reg = registry()
    entry = reg.entry(T1)
    outcome: dict[str, str] = {}
    answered = asyncio.Event()

    async def attempt(name: str, first_byte: bool) -> None:
        with reg.lease(entry) as lease:
            if first_byte:
                lease.first_byte(0.0, _cancel_me())  # the relay's read fails: here, a cancel
            try:
                await answered.wait()
                outcome[name] = "finished"
            except asyncio.CancelledError:
                outcome[name] = "moved on" if lease.ejected else f"cut: {lease.cut}"
                raise

    waiting = asyncio.create_task(attempt("waiting", first_byte=False))
    streaming = asyncio.create_task(attempt("streaming", first_byte=True))
    await asyncio.sleep(0)
    reg.eject(entry, "stalled")
    answered.set()
    await asyncio.gather(waiting, streaming, return_exceptions=True)
    assert outcome == {"waiting": "moved on", "streaming": "cut: ejected"}
    assert reg.store.counts() == {}
    assert entry.live.ejected
    assert entry.live.eject_reason == "stalled"
    assert not entry.waiting
    assert not entry.streaming


async def test_silent_streams_are_cut_and_count_as_failures() -> None:
    reg = registry()
    entry = reg.entry(T1)
    cuts: dict[str, str | None] = {}
    started = asyncio.Event()

    async def stream(name: str, last_io: float) -> None:
        with reg.lease(entry) as lease:
            lease.first_byte(last_io, _cancel_me())
            started.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cuts[name] = lease.cut
                raise

    tasks = [asyncio.create_task(stream("silent", 1.0)), asyncio.create_task(stream("busy", 9.0))]
    await started.wait()
    await asyncio.sleep(0)
    assert reg.cut_idle(now=10.0, idle_s=2.5) == 1  # 9 s silent against 1 s
    assert reg.cut_idle(now=10.0, idle_s=2.5) == 0  # already cut: not twice
    await asyncio.wait(tasks, timeout=0.1)
    assert cuts == {"silent": "idle"}
    assert entry.outlier.failed_now == 1
    tasks[1].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


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


def test_a_good_probe_readmits_a_backend_down_but_not_one_ejected_for_its_outcomes() -> None:
    reg = registry()
    down, failing = reg.entry(T1), reg.entry(LAT)
    reg.eject(down, "scrape_health 503")
    for _ in range(3):
        reg.request_failed(failing, "http_503")
    healthy = {u for u, load in reg.snapshot().loads.items() if load.healthy}
    assert healthy == {T2, TRITON}
    reg.readmit(down)
    reg.readmit(failing)  # its health was never the problem: it answers 200, and 503 to work
    assert reg.snapshot().load(T1).healthy
    assert not reg.snapshot().load(LAT).healthy


def _run_probation(reg: Registry, clock: Clock, outcomes: str) -> list[str]:
    """Eject LAT for its outcomes, then after each letter of `outcomes` (o: ok, f: failed,
    t: 5 s pass), what routing sees: out, trial (one request at a time), in."""
    entry = reg.entry(LAT)
    for _ in range(3):
        reg.request_failed(entry, "http_503")
    seen = []
    for c in outcomes:
        if c == "t":
            clock.now += 5
            reg.tick()
        elif c == "o":
            reg.request_succeeded(entry)
        else:
            reg.request_failed(entry, "http_503")
        load = reg.snapshot().load(LAT)
        if not load.healthy:
            seen.append("out")
        else:
            entry.waiting.add(None)  # type: ignore[arg-type]  # a request of ours waits there
            seen.append("trial" if not reg.snapshot().load(LAT).healthy else "in")
            entry.waiting.clear()
    return seen


@pytest.mark.parametrize(
    ("outcomes", "seen"),
    [
        # out for 5 s, then on probation; three successes put it back in full rotation
        ("tooo", ["trial", "trial", "trial", "in"]),
        # a failure on probation ejects it again, for twice as long (10 s)
        ("tof", ["trial", "trial", "out"]),
        ("toftt", ["trial", "trial", "out", "out", "trial"]),
    ],
)
def test_probation_after_an_ejection_lets_one_request_through_at_a_time(
    outcomes: str, seen: list[str]
) -> None:
    clock = Clock()
    reg = registry(clock)
    assert _run_probation(reg, clock, outcomes) == seen


def test_no_more_than_the_share_of_a_tier_is_ejected_for_its_outcomes() -> None:
    reg = registry(max_ejected_share=0.5)
    for url in (T1, T2):  # a pool of 3: one may go (the first always may), two may not
        for _ in range(3):
            reg.request_failed(reg.entry(url), "http_500")
    assert reg.entry(T1).live.ejected
    assert not reg.entry(T2).live.ejected
    reg.eject(reg.entry(T2), "stalled")  # the load monitor's ejections are not capped
    assert reg.entry(T2).live.ejected


def test_an_ejected_backend_load_is_unknown() -> None:
    clock = Clock()
    reg = registry(clock)
    st = reg.entry(T1).live
    st.running, st.waiting, st.scraped_at = 5, 2, clock.now
    reg.eject(reg.entry(T1), "stalled")
    load = reg.snapshot().load(T1)
    assert (load.running, load.waiting, load.stale) == (0, 0, True)


def test_credentials_refused_eject_at_once() -> None:
    reg = registry()
    reg.request_failed(reg.entry(T1), "auth", fatal=True)
    assert reg.entry(T1).live.eject_reason == "requests_auth"


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
    # The scrape saw 7 streams while none was ours: 7 others, and ours now.
    assert load.effective == 8
    st.inflight_at_scrape = 1  # ... while ours was: it is among the 7
    assert reg.snapshot().load(T1).effective == 7
    reg.store.release(T1)  # ours ended since the scrape: 6 others are left
    assert reg.snapshot().load(T1).effective == 6
    reg.store.acquire(T1)
    clock.now += 0.8  # more than 3 scrape intervals
    load = reg.snapshot().load(T1)
    assert load.stale
    assert load.effective == 1  # only the gateway's own count is trusted then
    assert reg.snapshot().taken_at == clock.now
    # Its backends are keyed by URL: none listed twice, which routing need not look for.
    assert reg.snapshot().distinct


async def test_each_field_of_a_snapshot_load_is_its_own() -> None:
    """The registry builds the loads by position: each field from its source, none swapped."""
    clock = Clock()
    reg = registry(clock)
    st = reg.entry(T1).live
    st.running, st.waiting, st.kv_usage, st.inflight_at_scrape = 5, 3, 0.25, 4
    st.scraped_at = clock.now
    with reg.lease(reg.entry(T1), 0.012):
        clock.now += 0.1  # the first lease's class held a while: it has a recent mean
        with reg.lease(reg.entry(T1), 0.012):
            load = reg.snapshot().load(T1)
            assert load._asdict() == {
                "running": 5, "waiting": 3, "kv_usage": 0.25, "inflight": 2, "healthy": True,
                "stale": False, "slos": ((0.012, 2),), "recent": reg.entry(T1).recent,
                "inflight_at_scrape": 4,
            }  # fmt: skip
            assert load.recent[0][0] == 0.012


def test_the_slos_in_flight_are_counted_tightest_first() -> None:
    reg = registry(Clock())
    entry = reg.entry(T1)
    for slo in (0.025, 0.012, 0.025, 0.05, 0.012):
        entry.count_lease(1, slo, 0.0)
    entry.count_lease(-1, 0.05, 0.0)
    assert reg.snapshot().load(T1).slos == ((0.012, 2), (0.025, 2))


def test_each_class_is_remembered_by_its_mean_count_lately() -> None:
    reg = registry(Clock())
    entry = reg.entry(T1)
    entry.count_lease(1, 0.012, 0.0)  # one 12 ms stream from 0 s ...
    entry.count_lease(1, 0.025, CLASS_MEMORY_S)  # ... a time constant on: 1 - 1/e
    assert dict(entry.recent) == pytest.approx({0.012: 1 - math.exp(-1)})
    entry.count_lease(-1, 0.012, CLASS_MEMORY_S)  # at the same instant: nothing to fold in
    entry.count_lease(-1, 0.025, 2 * CLASS_MEMORY_S)  # none of it since, a 25 ms one held
    assert dict(entry.recent) == pytest.approx(
        {0.012: (1 - math.exp(-1)) * math.exp(-1), 0.025: 1 - math.exp(-1)})
    assert reg.snapshot().load(T1).recent == entry.recent  # tightest first
    assert [s for s, _ in entry.recent] == [0.012, 0.025]
    entry.count_lease(1, 0.05, 20 * CLASS_MEMORY_S)  # long gone: forgotten
    assert entry.recent == ()


@pytest.mark.parametrize(
    ("changes", "at", "area", "square", "now"),
    [
        ([], 5.0, 0.0, 0.0, 0),  # never leased
        ([(1, 0.0)], 2.0, 2.0, 2.0, 1),  # one lease held 2 s
        ([(1, 0.0), (1, 1.0), (-2, 3.0)], 4.0, 1.0 + 4.0, 1.0 + 8.0, 0),  # 1 for 1 s, 2 for 2
        ([(1, 0.0), (1, 0.0), (1, 0.0), (-3, 0.5)], 10.0, 1.5, 4.5, 0),  # 3 for half a second
    ],
)
def test_the_lease_count_and_its_square_are_integrated_over_time(
    changes: list[tuple[int, float]], at: float, area: float, square: float, now: int
) -> None:
    entry = registry(Clock()).entry(T1)
    for delta, when in changes:
        entry.count_lease(delta, 0.025, when)
    assert entry.load_marks(at) == pytest.approx((area, square, now))
    assert entry.busy_mark(at) == pytest.approx((area, at))


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


async def _wake_order(arrivals: list[tuple[str, int, str]], wakes: int) -> list[str]:
    """Waiters (name, rank, tenant) arriving in order; the names `wakes` notify_one calls
    wake, in order (each woken waiter leaves)."""
    signal = ChangeSignal()
    woken: list[str] = []

    async def waiter(name: str, rank: int, tenant: str) -> None:
        if await signal.wait(5.0, rank=rank, tenant=tenant):
            woken.append(name)

    tasks = []
    for name, rank, tenant in arrivals:
        tasks.append(asyncio.create_task(waiter(name, rank, tenant)))
        await asyncio.sleep(0)
    for _ in range(wakes):
        signal.notify_one()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return woken


@pytest.mark.parametrize(
    ("arrivals", "expected"),
    [
        # One tenant, one priority: first come, first served.
        ([("a1", 1, "a"), ("a2", 1, "a"), ("a3", 1, "a")], ["a1", "a2", "a3"]),
        # Higher priority first, whenever it came.
        ([("b1", 0, "b"), ("b2", 0, "b"), ("i1", 2, "i"), ("s1", 1, "s")],
         ["i1", "s1", "b1", "b2"]),
        # A flood of one tenant does not keep another of the same priority waiting: turns.
        ([("f1", 1, "f"), ("f2", 1, "f"), ("f3", 1, "f"), ("f4", 1, "f"), ("g1", 1, "g"),
          ("g2", 1, "g")], ["f1", "g1", "f2", "g2", "f3", "f4"]),
        # Fair within a priority, and priorities still first.
        ([("b1", 0, "b"), ("f1", 1, "f"), ("f2", 1, "f"), ("g1", 1, "g"), ("i1", 2, "i")],
         ["i1", "f1", "g1", "f2", "b1"]),
    ],
)  # fmt: skip
async def test_the_queue_serves_priorities_first_and_tenants_in_turn(
    arrivals: list[tuple[str, int, str]], expected: list[str]
) -> None:
    assert await _wake_order(arrivals, len(arrivals)) == expected


async def test_a_tenant_joining_a_busy_queue_takes_its_share_not_everything() -> None:
    # f was woken 3 times while the queue stayed busy; g joins level with it: they alternate
    # from there (f first, it came first), g does not get three turns in a row to catch up.
    signal = ChangeSignal()
    woken: list[str] = []

    async def waiter(name: str, tenant: str) -> None:
        if await signal.wait(5.0, rank=1, tenant=tenant):
            woken.append(name)

    tasks = [asyncio.create_task(waiter(f"f{i}", "f")) for i in range(6)]
    await asyncio.sleep(0)
    for _ in range(3):
        signal.notify_one()
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(waiter(f"g{i}", "g")) for i in range(3)]
    await asyncio.sleep(0)
    for _ in range(4):
        signal.notify_one()
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert woken == ["f0", "f1", "f2", "f3", "g0", "f4", "g1"]


async def test_notify_wakes_everyone_in_priority_order() -> None:
    signal = ChangeSignal()
    woken: list[str] = []

    async def waiter(name: str, rank: int) -> None:
        await signal.wait(5.0, rank=rank, tenant=name)
        woken.append(name)

    tasks = [asyncio.create_task(waiter(n, r)) for n, r in (("b", 0), ("s", 1), ("i", 2))]
    await asyncio.sleep(0)
    signal.notify()
    await asyncio.gather(*tasks)
    assert woken == ["i", "s", "b"]


# -- displacement (tenants' priorities) --------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "held", "expected"),
    [
        # (url, rank, first byte yet) per lease held; the victim's url or None
        (2, [(T1, 0, False)], T1),
        (2, [(T1, 1, False)], None),  # standard work is never displaced
        (2, [(T1, 0, True)], None),  # answering already: too late to take its place
        (1, [(T1, 0, False)], None),  # only interactive work displaces
        (2, [(T1, 0, False), (T2, -3, False)], T2),  # the lowest priority goes first
        (2, [(LAT, 0, False)], None),  # not among the candidates
    ],
)
async def test_displace_takes_the_place_of_batch_work_before_its_first_byte(
    rank: int, held: list[tuple[str, int, bool]], expected: str | None
) -> None:
    reg = registry()
    outcome: dict[int, str] = {}
    release = asyncio.Event()

    async def attempt(i: int, url: str, lease_rank: int, answered: bool) -> None:
        with reg.lease(reg.entry(url)) as lease:
            lease.rank = lease_rank
            if answered:
                lease.first_byte(0.0, lambda: None)
            try:
                await release.wait()
                outcome[i] = "finished"
            except asyncio.CancelledError:
                outcome[i] = "displaced" if lease.displaced else "cancelled"
                raise

    tasks = [asyncio.create_task(attempt(i, *h)) for i, h in enumerate(held)]
    await asyncio.sleep(0)
    candidates = [reg.entry(T1).backend, reg.entry(T2).backend]
    taken = reg.displace(candidates, rank)
    assert (taken.url if taken else None) == expected
    release.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    victims = [held[i][0] for i, o in outcome.items() if o == "displaced"]
    assert victims == ([expected] if expected else [])
    assert all(o in ("finished", "displaced") for o in outcome.values())
    assert reg.store.counts() == {}  # every lease given back
