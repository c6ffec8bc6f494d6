"""The request path's series (Telemetry.add / observe / flush) against prometheus_client's own
inc() and observe(): the same /metrics page, whatever the values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gateway.observe.telemetry import LATENCY_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, Telemetry


def _page(t: Telemetry, name: str) -> list[str]:
    """The lines of one metric family on `t`'s /metrics page, creation times left out."""
    return [line for line in t.exposition().decode().splitlines()
            if line.startswith(name) and "_created" not in line]  # fmt: skip


# Values on each side of a bound, on a bound, below every bound and past the last (+Inf).
_EDGES = [0.0, 1e-9, 0.001, 0.0010000001, 0.0025, 0.007, 1.0, 59.999, 60.0, 120.0, 120.5, 1e9]


@pytest.mark.parametrize(
    ("metric", "bounds"),
    [("duration", LATENCY_BUCKETS), ("ttft", TTFT_BUCKETS), ("tpot", TPOT_BUCKETS)],
)
def test_observations_counted_as_observe_counts_them(
    metric: str, bounds: tuple[float, ...]
) -> None:
    values = [*_EDGES, *bounds, *(math.nextafter(b, math.inf) for b in bounds)]
    batched, direct = Telemetry(), Telemetry()
    for v in values:
        batched.observe((getattr(batched, metric), "latency", "m"), v)
        getattr(direct, metric).labels("latency", "m").observe(v)
    name = f"tiergate_{'request_duration' if metric == 'duration' else metric}_seconds"
    assert _page(batched, name) == _page(direct, name)
    assert any("_count" in line for line in _page(batched, name))


def test_observations_of_two_flushes_add_up() -> None:
    batched, direct = Telemetry(), Telemetry()
    for round_values in ([0.3, 0.004], [0.3, 7.0, 500.0]):
        for v in round_values:
            batched.observe((batched.duration, "throughput", "m"), v)
            direct.duration.labels("throughput", "m").observe(v)
        batched.flush()
    name = "tiergate_request_duration_seconds"
    assert _page(batched, name) == _page(direct, name)


@pytest.mark.parametrize(
    ("amounts", "shown"),
    [
        ([1.0], 1.0),
        ([1.0, 1.0, 1.0], 3.0),
        ([64.0, 2.0], 66.0),  # a stream's tokens
        ([], None),  # never counted: no series
    ],
)
def test_counts_added_appear_summed(amounts: list[float], shown: float | None) -> None:
    t = Telemetry()
    for a in amounts:
        t.add((t.requests, "latency", "http://a", "m", "200"), a)
    labels = {"tier": "latency", "backend": "http://a", "model": "m", "status": "200"}
    t.exposition()  # what /metrics does: flush, then write
    assert t.registry.get_sample_value("tiergate_requests_total", labels) == shown


def test_a_gauge_goes_up_and_down_between_reads() -> None:
    t = Telemetry()
    key = (t.inflight, "latency", "http://a")
    t.child(*key)  # its series at 0, as the registry makes it
    for delta in (1.0, 1.0, -1.0):
        t.add(key, delta)
    t.flush()
    labels = {"tier": "latency", "backend": "http://a"}
    assert t.registry.get_sample_value("tiergate_inflight", labels) == 1.0
    t.add(key, 1.0)
    t.add(key, -1.0)  # one request, begun and ended between two reads
    t.flush()
    assert t.registry.get_sample_value("tiergate_inflight", labels) == 1.0
    t.add(key, -1.0)
    t.exposition()
    assert t.registry.get_sample_value("tiergate_inflight", labels) == 0.0


def test_a_forgotten_backend_leaves_nothing_pending() -> None:
    """Counts added for a backend that then left the pool do not bring its series back."""
    t = Telemetry()
    t.add((t.requests, "throughput", "http://gone", "m", "200"))
    t.observe((t.duration, "throughput", "m"), 0.1)
    t.add((t.attempts, "http://gone", "ok"))
    t.forget_backend("http://gone")
    page = t.exposition().decode()
    assert "http://gone" not in page
    assert 'tiergate_request_duration_seconds_count{model="m",tier="throughput"} 1.0' in page


def test_with_several_workers_each_count_goes_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A worker's counts go to its series (its file) as they come: another worker's /metrics
    reads them, and a worker killed has nothing left unflushed."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    t = Telemetry()
    key = (t.requests, "latency", "http://a", "m", "200")
    t.add(key)
    t.observe((t.duration, "latency", "m"), 0.2)
    assert t.child(*key)._value.get() == 1.0
    assert t.child(t.duration, "latency", "m")._sum.get() == pytest.approx(0.2)
