"""The values routing reads and returns (gateway.routing.types)."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.routing import BackendLoad, LoadSnapshot, Reason, Role
from tests.unit.routingfixtures import T0, T1, load, snap


@pytest.mark.parametrize(
    ("bl", "effective"),
    [
        pytest.param(load(3, 2, inflight=4), 5, id="scrape-above-inflight"),
        pytest.param(load(3, 2, inflight=9), 9, id="inflight-above-scrape"),
        pytest.param(load(3, 2, inflight=5), 5, id="scrape-equal-to-inflight"),
        pytest.param(load(30, 20, inflight=4, stale=True), 4, id="stale-inflight-only"),
        pytest.param(load(0, 0, inflight=7, stale=True), 7, id="stale-inflight-above-scrape"),
        pytest.param(BackendLoad(), 0, id="defaults"),
        # With the in-flight count the scrape saw: ours now, plus the others it saw then.
        pytest.param(BackendLoad(running=3, waiting=2, inflight=4, inflight_at_scrape=5), 4,
                     id="ours-ended-since-the-scrape"),
        pytest.param(BackendLoad(running=8, waiting=2, inflight=4, inflight_at_scrape=5), 9,
                     id="others-beside-ours"),
        pytest.param(BackendLoad(running=1, inflight=6, inflight_at_scrape=2), 6,
                     id="ours-not-yet-running"),
        pytest.param(BackendLoad(running=30, inflight=3, inflight_at_scrape=0, stale=True), 3,
                     id="stale-with-the-count"),
    ],
)
def test_effective_load(bl: BackendLoad, effective: int) -> None:
    assert bl.effective == effective


def test_missing_load_is_healthy_idle_stale() -> None:
    s = snap((T0, None))
    assert s.load(T0.url) == BackendLoad(healthy=True, stale=True)
    assert s.load("http://nowhere").effective == 0


def test_snapshot_copies_its_loads() -> None:
    loads = {T0.url: load(1)}
    s = LoadSnapshot(backends=(T0, T1), loads=loads, taken_at=5.0)
    loads[T0.url] = load(99)
    loads[T1.url] = load(98)
    assert s.load(T0.url) == load(1)
    assert s.loads == {T0.url: load(1)}
    assert s == LoadSnapshot(backends=(T0, T1), loads={T0.url: load(1)}, taken_at=5.0)
    assert dataclasses.replace(s, taken_at=6.0).load(T0.url) == load(1)


def test_values_are_frozen() -> None:
    # (A snapshot's own fields are read only by convention, not at run time: see its class.)
    s = snap((T0, load(1)))
    with pytest.raises(TypeError):
        s.loads[T0.url] = load()  # type: ignore[index]
    with pytest.raises(AttributeError):  # a named tuple's field
        load().running = 3  # type: ignore[misc]
    assert Role("latency") is Role.LATENCY
    assert str(Reason.GOLDEN_RANGE) == "golden_range"
