"""The demand meter (gateway.planner.demand) on a virtual clock: arrivals at known rates, steady,
rising and stopped, give the rate, the trend and the answer length they were made with; a surge
is read within seconds, and steady Poisson arrivals never read as one."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from gateway.planner.demand import Demand, class_name
from gateway.planner.replicas import ClassDemand
from gateway.routing.types import Slo

TAU = 10.0
SURGE = TAU / 6
CHAT = Slo(ttft_s=1.0, tpot_s=0.025)
TIGHT = Slo(ttft_s=0.5, tpot_s=0.008)


def arrivals(
    meter: Demand, slo: Slo, rate_at: Callable[[float], float], start: float, end: float
) -> float:
    """Arrivals from `start` to `end` at the rate `rate_at(t)` (requests/s), evenly spaced by
    their integral; returns the end."""
    t, due = start, 0.0
    step = 0.001
    while t < end:
        due += rate_at(t) * step
        while due >= 1.0:
            meter.arrived(slo, t)
            due -= 1.0
        t += step
    return end


@pytest.mark.parametrize(
    ("case", "rate_at", "rate", "trend"),
    [
        ("steady 10 requests/s", lambda t: 10.0, 10.0, 0.0),
        ("steady 0.5 requests/s", lambda t: 0.5, 0.5, 0.0),
        ("rising by 0.2 requests/s each second", lambda t: 2.0 + 0.2 * t, 2.0 + 0.2 * 200, 0.2),
        # Falling: the short average, a lag (0.05 x tau) above the rate, is not carried down.
        ("falling by 0.05 requests/s each second", lambda t: 12.0 - 0.05 * t, 2.5, -0.05),
    ],
)
def test_rate_and_trend_follow_the_arrivals(
    case: str, rate_at: Callable[[float], float], rate: float, trend: float
) -> None:
    meter = Demand(TAU, 128, SURGE)
    now = arrivals(meter, CHAT, rate_at, 0.0, 200.0)
    (got,) = meter.classes(now)
    # Within 15%: at 5 arrivals per time constant the averages saw-tooth between arrivals.
    assert got.rate == pytest.approx(rate, rel=0.15), case
    assert got.trend == pytest.approx(trend, abs=0.02), case


def test_a_drop_is_not_read_below_the_rate_left() -> None:
    """From 100 to 5 requests/s: the rate read never goes under the 5 that go on (a decline
    carried over the time constant would have read 0 within seconds)."""
    meter = Demand(TAU, 128, SURGE)
    t = arrivals(meter, CHAT, lambda _: 100.0, 0.0, 100.0)
    while t < 200.0:
        t = arrivals(meter, CHAT, lambda _: 5.0, t, t + 2.0)
        (got,) = meter.classes(t)
        assert got.rate >= 5.0 * 0.85, t


def test_a_stopped_class_decays_to_nothing_and_classes_are_apart() -> None:
    meter = Demand(TAU, 128, SURGE)
    arrivals(meter, CHAT, lambda t: 10.0, 0.0, 100.0)
    arrivals(meter, TIGHT, lambda t: 2.0, 0.0, 100.0)
    by_name = {c.name: c for c in meter.classes(100.0)}
    assert by_name[class_name(CHAT)].rate == pytest.approx(10.0, rel=0.08)
    assert by_name[class_name(TIGHT)].rate == pytest.approx(2.0, rel=0.08)
    later = {c.name: c for c in meter.classes(100.0 + 20 * TAU)}
    assert later[class_name(CHAT)].rate < 0.01
    assert later[class_name(CHAT)].slo == CHAT


def test_answer_lengths_are_averaged_recently() -> None:
    meter = Demand(TAU, 128, SURGE)
    meter.arrived(CHAT, 0.0)
    assert meter.classes(0.0)[0].output_tokens == 128  # none finished yet: the default
    for i in range(50):
        meter.finished(CHAT, 100, float(i))
    assert meter.classes(50.0)[0].output_tokens == pytest.approx(100)
    # Long answers since: the mean moves to them within a few time constants.
    for i in range(50, 50 + int(5 * TAU)):
        meter.finished(CHAT, 400, float(i))
    assert meter.classes(100.0)[0].output_tokens == pytest.approx(400, rel=0.02)


def test_names_say_both_bounds() -> None:
    assert class_name(CHAT) == "ttft<=1000ms,tpot<=25ms"
    assert class_name(TIGHT) == "ttft<=500ms,tpot<=8ms"


# As the gateway's defaults have them: tau 60 s, the surge average 5 s, read every 2 s, a
# surge's margin the plan's headroom.
LONG_TAU, LONG_SURGE, READ_S, MARGIN = 60.0, 5.0, 2, 0.2


def poisson_reads(meter: Demand, rate: float, end: float, seed: int) -> list[ClassDemand]:
    """Poisson arrivals at `rate` from 0 to `end`, the meter read every READ_S as the planner
    reads it, from 300 s on (past its warm-up)."""
    rng, t = random.Random(seed), 0.0
    out: list[ClassDemand] = []
    for read_at in range(READ_S, int(end) + 1, READ_S):
        while (nxt := t + rng.expovariate(rate)) < read_at:
            meter.arrived(CHAT, nxt)
            t = nxt
        t = read_at  # (memoryless: the next gap drawn afresh from here)
        if read_at >= 300:
            out.append(meter.classes(read_at)[0])
    return out


@pytest.mark.parametrize("rate", [0.2, 2.0, 20.0, 200.0])
def test_steady_poisson_arrivals_never_read_as_a_surge(rate: float) -> None:
    """An hour of steady arrivals, read as often as the planner does: no surge, and the rate
    read stays near the true one."""
    meter = Demand(LONG_TAU, 128, LONG_SURGE, MARGIN)
    reads = poisson_reads(meter, rate, 3900.0, seed=int(rate * 10))
    assert not any(r.surge for r in reads), rate
    # The short average over 60 s of Poisson arrivals: 5 of its standard deviations, and 10%
    # for the trend (only a rising one is carried: its noise reads high, never low).
    bound = 1 + 5 / (2 * LONG_TAU * rate) ** 0.5 + 0.1
    assert max(r.rate for r in reads) < rate * bound, rate


@pytest.mark.parametrize(
    ("base", "period_s"),
    [
        # bench autoscale's day compressed into 30 min on H200-like engines: 105 -> 525 -> 105
        (105.0, 1800.0),
        (20.0, 1800.0),
    ],
)
def test_a_fast_day_at_high_rates_is_no_surge(base: float, period_s: float) -> None:
    """A day's cycle (x5 and back) compressed into half an hour: at hundreds of requests
    per second the slow averages' lag on its curve is many deviations of the noise, but within
    the plan's headroom; it is no surge (without the margin it reads as one most of the rise)."""
    rng, t = random.Random(int(base)), 0.0
    peak = 5.0 * base
    meter = Demand(LONG_TAU, 128, LONG_SURGE, MARGIN)
    surges = []
    for read_at in range(READ_S, int(period_s) + 1, READ_S):
        # Poisson arrivals at the day's rate, by thinning arrivals at its peak.
        while (nxt := t + rng.expovariate(peak)) < read_at:
            t = nxt
            rate = base * (1 + 4 * (1 - math.cos(2 * math.pi * t / period_s)) / 2)
            if rng.random() < rate / peak:
                meter.arrived(CHAT, t)
        t = read_at
        if read_at >= 60 and meter.classes(read_at)[0].surge:
            surges.append(read_at)
    assert surges == [], surges[:10]


def reads(
    meter: Demand, rate_at: Callable[[float], float], start: float, end: float
) -> list[tuple[float, ClassDemand]]:
    """Arrivals at `rate_at(t)` from `start` to `end`, the meter read every READ_S as the
    planner reads it: (when, what it read)."""
    out: list[tuple[float, ClassDemand]] = []
    t = start
    while t < end:
        t = arrivals(meter, CHAT, rate_at, t, t + READ_S)
        out.append((t, meter.classes(t)[0]))
    return out


def stepped(
    before: float, after: float, ramp_s: float, at: float = 600.0
) -> Callable[[float], float]:
    def rate_at(t: float) -> float:
        if t < at:
            return before
        return after if ramp_s == 0 else min(after, before + (after - before) * (t - at) / ramp_s)

    return rate_at


@pytest.mark.parametrize(
    ("case", "before", "after", "ramp_s", "within_s"),
    [
        # The two slow averages alone read about 21 requests/s 15 s into this one.
        ("a step, x5", 10.0, 50.0, 0.0, 20.0),
        ("a flash crowd, x5 within a minute", 10.0, 50.0, 60.0, 30.0),
        ("a step, x2", 20.0, 40.0, 0.0, 10.0),
    ],
)
def test_a_surge_is_read_within_seconds(
    case: str, before: float, after: float, ramp_s: float, within_s: float
) -> None:
    """Within `within_s` of its start a surge reads as one, at >= 80% of the rate then (the
    fast average lags it by its time constant), and rising."""
    rate_at = stepped(before, after, ramp_s)
    meter = Demand(LONG_TAU, 128, LONG_SURGE, MARGIN)
    t, got = reads(meter, rate_at, 0.0, 600.0 + within_s)[-1]
    assert got.surge, case
    assert got.rate >= 0.8 * rate_at(t), case
    assert got.trend > 0, case


@pytest.mark.parametrize(
    ("case", "before", "after", "ramp_s", "into_s", "share"),
    [
        # Read against the short average alone: 14% of the slope 14 s in, 34% 30 s in.
        ("x5 within a minute, 16 s in", 10.0, 50.0, 60.0, 16.0, 0.35),
        ("x5 within a minute, 30 s in", 10.0, 50.0, 60.0, 30.0, 0.6),
        ("x5 within two minutes, 20 s in", 100.0, 500.0, 120.0, 20.0, 0.45),
        ("x5 within a minute, from 2 requests/s, 40 s in", 2.0, 10.0, 60.0, 40.0, 0.6),
    ],
)
def test_a_rising_surge_reads_its_slope_within_seconds(
    case: str, before: float, after: float, ramp_s: float, into_s: float, share: float
) -> None:
    """A ramp seconds old: the slope read (carried over a replica's start-up by the plan) is at
    least `share` of the true one, and not above it."""
    meter = Demand(LONG_TAU, 128, LONG_SURGE, MARGIN)
    t, got = reads(meter, stepped(before, after, ramp_s), 0.0, 600.0 + into_s)[-1]
    slope = (after - before) / ramp_s
    assert got.surge, case
    assert share * slope <= got.trend <= 1.05 * slope, (case, t, got.trend)


@pytest.mark.parametrize(("before", "after"), [(10.0, 50.0), (20.0, 40.0), (2.0, 10.0)])
def test_a_surge_hands_over_to_the_slow_averages_without_a_cliff(
    before: float, after: float
) -> None:
    """Once the slow averages have caught up the surge ends, and the rate read goes on from
    where the surge left it: from 20 s after the step on, within -10%/+15% of the new rate."""
    meter = Demand(LONG_TAU, 128, LONG_SURGE, MARGIN)
    got = reads(meter, stepped(before, after, 0.0), 0.0, 1200.0)
    after_step = [(t, d) for t, d in got if t >= 620.0]
    assert any(d.surge for _, d in after_step)
    assert not after_step[-1][1].surge
    for t, d in after_step:
        assert 0.9 * after <= d.rate <= 1.15 * after, (t, d)


@pytest.mark.parametrize("rate", [0.5, 5.0, 50.0])
def test_a_class_that_comes_at_a_steady_rate_reads_it_from_its_first_seconds(rate: float) -> None:
    """As after the gateway's start: nothing is known of the time before the first request, so
    the class is not read as climbing from 0 (a rise, carried over the start-up time) nor as a
    surge."""
    meter = Demand(LONG_TAU, 128, LONG_SURGE, MARGIN)
    for t, got in reads(meter, lambda _: rate, 1000.0, 1300.0):
        assert not got.surge, t
        if t >= 1020.0:
            assert got.rate == pytest.approx(rate, rel=0.2), t
            assert abs(got.trend) * 120.0 < 0.2 * rate, t  # carried over a 120-s start-up


def test_the_surge_average_must_be_the_shorter() -> None:
    with pytest.raises(ValueError, match="surge_tau_s"):
        Demand(10.0, 128, 10.0)
