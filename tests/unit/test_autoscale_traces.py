"""The autoscaling study's traces: rates, shapes, and arrivals drawn from them."""

from __future__ import annotations

import itertools
import math

import pytest

from loadtests.autoscale.traces import SPREAD, TRACES, Klass, Trace, arrivals

CLASSES = (Klass("a", 1.0, 0.012, 0.25, 100, 400), Klass("b", 1.0, 0.025, 0.75, 100, 400))


@pytest.mark.parametrize(
    ("kind", "t", "rate"),
    [
        ("diurnal", 0.0, 1.0),  # the trough
        ("diurnal", 3600.0, 5.0),  # the peak, halfway through the day
        ("diurnal", 7200.0, 1.0),
        ("flash", 0.0, 1.2),
        ("flash", 600.0, 1.2),  # the crowd starts a quarter in
        ("flash", 630.0, 3.6),  # halfway up its one-minute ramp
        ("flash", 660.0, 6.0),  # x5
        ("flash", 1260.0, 6.0),  # held a quarter of the trace
        ("flash", 1320.0, 1.2),  # and back within a minute
        ("shift", 100.0, 2.0),
    ],
)
def test_rates_in_ceilings(kind: str, t: float, rate: float) -> None:
    trace = {"diurnal": Trace("diurnal", 7200.0, ""), "flash": Trace("flash", 2400.0, ""),
             "shift": Trace("shift", 2400.0, "")}[kind]  # fmt: skip
    assert trace.rate(t) == pytest.approx(rate)
    assert trace.rate(t) <= trace.peak


def test_the_rate_never_passes_the_peak_the_thinning_draws_from() -> None:
    for trace in TRACES.values():
        assert max(trace.rate(t) for t in range(0, int(trace.duration_s), 7)) <= trace.peak


def test_arrivals_follow_the_rate_and_the_mix() -> None:
    trace = Trace("diurnal", 3600.0, "")
    got = list(arrivals(trace, CLASSES, 2.0, seed=3))
    # The expected count is the integral of the rate: a mean of 3 ceilings x 2 requests/s.
    expected = 3.0 * 2.0 * 3600.0
    assert abs(len(got) - expected) < 4 * math.sqrt(expected)
    assert all(a.at < b.at for a, b in itertools.pairwise(got))
    share = sum(a.klass == 0 for a in got) / len(got)
    assert share == pytest.approx(0.25, abs=0.02)
    # More in the middle of the day than at its ends.
    middle = sum(1200 <= a.at < 2400 for a in got)
    ends = sum(a.at < 600 or a.at >= 3000 for a in got)
    assert middle > 2 * ends


def test_arrivals_are_the_seeds() -> None:
    trace = TRACES["flash"]
    assert list(arrivals(trace, CLASSES, 1.0, 5)) == list(arrivals(trace, CLASSES, 1.0, 5))
    assert list(arrivals(trace, CLASSES, 1.0, 5)) != list(arrivals(trace, CLASSES, 1.0, 6))


def test_the_shift_makes_answers_longer_halfway() -> None:
    trace = Trace("shift", 1000.0, "")
    got = list(arrivals(trace, CLASSES, 5.0, seed=1))
    before = [a.output_tokens for a in got if a.at < 500]
    after = [a.output_tokens for a in got if a.at >= 500]
    assert min(before) >= 100 * (1 - SPREAD)
    assert max(before) <= 100 * (1 + SPREAD)
    assert min(after) >= 400 * (1 - SPREAD)
    assert max(after) <= 400 * (1 + SPREAD)
    assert sum(after) / len(after) == pytest.approx(400, rel=0.05)
