"""The demand meter (gateway.planner.demand) on a virtual clock: arrivals at known rates, steady,
rising and stopped, give the rate, the trend and the answer length they were made with."""

from __future__ import annotations

import pytest

from gateway.planner.demand import Demand, class_name
from gateway.routing.types import Slo

TAU = 10.0
CHAT = Slo(ttft_s=1.0, tpot_s=0.025)
TIGHT = Slo(ttft_s=0.5, tpot_s=0.008)


def arrivals(meter: Demand, slo: Slo, rate_at: object, start: float, end: float) -> float:
    """Arrivals from `start` to `end` at the rate `rate_at(t)` (requests/s), evenly spaced by
    their integral; returns the end."""
    t, due = start, 0.0
    step = 0.001
    while t < end:
        due += rate_at(t) * step  # type: ignore[operator]
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
    case: str, rate_at: object, rate: float, trend: float
) -> None:
    meter = Demand(TAU, default_output_tokens=128)
    now = arrivals(meter, CHAT, rate_at, 0.0, 200.0)
    (got,) = meter.classes(now)
    # Within 15%: at 5 arrivals per time constant the averages saw-tooth between arrivals.
    assert got.rate == pytest.approx(rate, rel=0.15), case
    assert got.trend == pytest.approx(trend, abs=0.02), case


def test_a_drop_is_not_read_below_the_rate_left() -> None:
    """From 100 to 5 requests/s: the rate read never goes under the 5 that go on (a decline
    carried over the time constant would have read 0 within seconds)."""
    meter = Demand(TAU, default_output_tokens=128)
    t = arrivals(meter, CHAT, lambda _: 100.0, 0.0, 100.0)
    while t < 200.0:
        t = arrivals(meter, CHAT, lambda _: 5.0, t, t + 2.0)
        (got,) = meter.classes(t)
        assert got.rate >= 5.0 * 0.85, t


def test_a_stopped_class_decays_to_nothing_and_classes_are_apart() -> None:
    meter = Demand(TAU, default_output_tokens=128)
    arrivals(meter, CHAT, lambda t: 10.0, 0.0, 100.0)
    arrivals(meter, TIGHT, lambda t: 2.0, 0.0, 100.0)
    by_name = {c.name: c for c in meter.classes(100.0)}
    assert by_name[class_name(CHAT)].rate == pytest.approx(10.0, rel=0.08)
    assert by_name[class_name(TIGHT)].rate == pytest.approx(2.0, rel=0.08)
    later = {c.name: c for c in meter.classes(100.0 + 20 * TAU)}
    assert later[class_name(CHAT)].rate < 0.01
    assert later[class_name(CHAT)].slo == CHAT


def test_answer_lengths_are_averaged_recently() -> None:
    meter = Demand(TAU, default_output_tokens=128)
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
