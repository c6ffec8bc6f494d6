"""The load monitor's rules, on a virtual clock: what a scrape's result does to a backend
(load figures, ejection on failures or a stall, probing and re-admission). No I/O: each case
feeds `Monitor.observe` the results a round of scrapes would have produced."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.backends.monitor import Monitor, ScrapeFailed, merge
from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.observe.telemetry import Telemetry
from gateway.wire.metrics import EngineStats

URL = "http://b:1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def build(**monitor: Any) -> tuple[Monitor, Registry, Clock]:
    clock = Clock()
    cfg = {"scrape_interval_s": 0.25, "probe_interval_s": 2.0, "eject_after_failures": 3,
           "stall_after_s": 5.0, **monitor}  # fmt: skip
    settings = Settings(
        tiers=[{"name": "awq", "role": "throughput", "backends": [{"url": URL, "models": ["m"]}]}],
        monitor=cfg,
    )
    reg = Registry(settings, MemoryInflightStore(), Telemetry(), clock)
    session: Any = None  # observe() does no I/O
    return Monitor(reg, settings.monitor, session, Telemetry()), reg, clock


def page(running: float = 0, waiting: float = 0, generated: float | None = 0.0,
         kv: float = 0.1) -> dict[str, EngineStats]:  # fmt: skip
    return {"m": EngineStats(running=running, waiting=waiting, kv_usage=kv,
                             generation_tokens=generated)}  # fmt: skip


OK, SOFT, HARD = "ok", "soft", "hard"

# Each step: (seconds since start, result: ok(running, generated) | soft | hard),
# then (ejected, reason) after the step.
Step = tuple[float, str, tuple[float, float], bool, str]
CASES: list[tuple[str, list[Step]]] = [
    ("good scrapes keep it in", [
        (0.0, OK, (0, 0), False, ""), (0.25, OK, (3, 10), False, ""),
    ]),
    ("two soft failures are tolerated, the third ejects", [
        (0.0, SOFT, (0, 0), False, ""), (0.25, SOFT, (0, 0), False, ""),
        (0.5, SOFT, (0, 0), True, "scrape_ClientConnectorError"),
    ]),
    ("a good scrape resets the soft count", [
        (0.0, SOFT, (0, 0), False, ""), (0.25, SOFT, (0, 0), False, ""),
        (0.5, OK, (0, 0), False, ""), (0.75, SOFT, (0, 0), False, ""),
        (1.0, SOFT, (0, 0), False, ""),
    ]),
    ("a hard failure ejects at once", [
        (0.0, HARD, (0, 0), True, "scrape_health 503"),
    ]),
    ("busy with a flat token counter past stall_after_s: stalled", [
        (0.0, OK, (4, 100), False, ""), (2.5, OK, (4, 100), False, ""),
        (4.9, OK, (4, 100), False, ""), (5.0, OK, (4, 100), True, "stalled"),
    ]),
    ("a moving counter is progress", [
        (0.0, OK, (4, 100), False, ""), (3.0, OK, (4, 150), False, ""),
        (6.0, OK, (4, 200), False, ""), (9.0, OK, (4, 250), False, ""),
    ]),
    ("idle with a flat counter is not a stall", [
        (0.0, OK, (0, 100), False, ""), (10.0, OK, (0, 100), False, ""),
    ]),
    ("an ejected backend comes back on a good probe", [
        (0.0, HARD, (0, 0), True, "scrape_health 503"), (2.0, OK, (0, 0), False, ""),
    ]),
    ("a failed probe keeps it out", [
        (0.0, HARD, (0, 0), True, "scrape_health 503"), (2.0, SOFT, (0, 0), True, ""),
        (4.0, OK, (0, 0), False, ""),
    ]),
    ("a stalled backend stays out while still stalled", [
        (0.0, OK, (2, 7), False, ""), (5.0, OK, (2, 7), True, "stalled"),
        (7.0, OK, (2, 7), True, "stalled"), (9.0, OK, (2, 8), False, ""),
    ]),
]  # fmt: skip


@pytest.mark.parametrize("steps", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_scrape_results_eject_and_readmit(steps: list[Step]) -> None:
    mon, reg, clock = build()
    entry = reg.entry(URL)
    for at, kind, (running, generated), ejected, reason in steps:
        clock.now = at
        if kind == OK:
            result: Any = page(running=running, generated=generated)
        elif kind == SOFT:
            result = ScrapeFailed("ClientConnectorError", hard=False)
        else:
            result = ScrapeFailed("health 503", hard=True)
        mon.observe(entry, result, at)
        assert entry.live.ejected is ejected, (at, kind)
        if reason:
            assert entry.live.eject_reason == reason


def test_a_good_scrape_sets_the_load_routing_reads() -> None:
    mon, reg, clock = build()
    entry = reg.entry(URL)
    clock.now = 1.0
    mon.observe(entry, page(running=7, waiting=3, kv=0.4), 1.0)
    load = reg.snapshot().load(URL)
    assert (load.running, load.waiting, load.kv_usage, load.stale) == (7, 3, 0.4, False)
    clock.now = 2.0  # no scrape for 4 intervals: stale
    assert reg.snapshot().load(URL).stale


def test_backends_down_are_scraped_only_when_their_probe_is_due() -> None:
    mon, reg, clock = build()
    entry = reg.entry(URL)
    assert mon.due(entry, 0.0)
    clock.now = 10.0
    reg.eject(entry, "scrape_health 503")  # down, between rounds
    assert not mon.due(entry, 10.25)
    assert not mon.due(entry, 11.9)
    assert mon.due(entry, 12.0)
    assert mon.health_due(entry, 12.0)


def test_health_is_checked_every_probe_interval_while_healthy() -> None:
    mon, reg, _ = build()
    entry = reg.entry(URL)
    assert mon.health_due(entry, 0.0)
    mon.observe(entry, page(), 0.0)
    assert not mon.health_due(entry, 1.9)
    assert mon.health_due(entry, 2.0)


def test_a_stall_counts_the_gateways_own_in_flight_requests_as_work() -> None:
    mon, reg, _ = build(stall_after_s=1.0)
    entry = reg.entry(URL)
    reg.store.acquire(URL)  # the engine says 0 running, but we have a request there
    for at in (0.0, 0.5, 1.0):
        mon.observe(entry, page(running=0, generated=42), at)
    assert entry.live.eject_reason == "stalled"


def test_merge_sums_models_of_one_engine() -> None:
    stats = {"a": EngineStats(running=2, waiting=1, kv_usage=0.2, generation_tokens=10,
                              spec_draft_tokens=10, spec_accepted_tokens=5),
             "b": EngineStats(running=1, waiting=0, kv_usage=0.5, generation_tokens=5)}  # fmt: skip
    assert merge(stats) == (3, 1, 0.5, 0.5, 15)
    assert merge({}) == (0, 0, 0.0, None, None)
