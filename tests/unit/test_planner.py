"""The planner (gateway.planner), by tables of cases on curves whose figures can be worked out by
hand: a replica's capacity within an SLO class, the forecast, and the replicas each tier needs
(known curves and demands, a tier with no data, the minimum and maximum, costs, the headroom for
the start-up time, a class no tier serves)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.planner import (
    ClassDemand,
    PlanParams,
    TierSupply,
    capacity,
    forecast,
    plan,
    tier_capacity,
)
from gateway.routing.curves import Curve, Prediction
from gateway.routing.types import Slo


def pred(tpot: float, knee: int, rise: float, ttft: float = 0.1) -> Prediction:
    """TPOT `tpot` s flat up to `knee` streams, then `rise` s more per stream (straight lines,
    so the curves' interpolation between knots is exact); TTFT `ttft` s at any load."""
    return Prediction(Curve.of(lambda n: tpot + rise * max(0, n - knee)), Curve.of(lambda n: ttft))


STANDARD = Slo(ttft_s=1.0, tpot_s=0.025)
TIGHT = Slo(ttft_s=1.0, tpot_s=0.010)
# Half the streams meeting the SLO: a curve meets it exactly where it is at or below it.
AT_THE_CURVE = 0.5


@pytest.mark.parametrize(
    ("case", "p", "slo", "tokens", "want"),
    [
        # 10 ms to 16 streams, +1 ms a stream after: 25 ms at 31. Long answers: the most
        # requests/s at the knee, 16 / (0.1 + 100 x 0.010).
        ("long answers: best at the knee", pred(0.010, 16, 0.001), STANDARD, 100, 16 / 1.1),
        # Short answers: the TTFT weighs more, the most at the SLO's edge, 31 / (0.1 + 10 x 0.025).
        ("short answers: best at the SLO's edge", pred(0.010, 16, 0.001), STANDARD, 10, 31 / 0.35),
        ("never within the SLO", pred(0.030, 16, 0.001), STANDARD, 100, 0.0),
        # TTFT past the SLO of 1 s at any load.
        ("first token too late", pred(0.010, 16, 0.001, ttft=1.5), STANDARD, 100, 0.0),
    ],
)
def test_capacity_of_a_replica(
    case: str, p: Prediction, slo: Slo, tokens: float, want: float
) -> None:
    assert capacity(p, slo, tokens, AT_THE_CURVE, 256) == pytest.approx(want), case


def test_capacity_stops_at_the_batch_limit_and_asks_for_more_than_half_when_told() -> None:
    p = pred(0.010, 16, 0.001)
    assert capacity(p, STANDARD, 10, AT_THE_CURVE, 8) == pytest.approx(8 / 0.2)
    # 90% of the streams within 25 ms (spread 0.1 in ln TPOT): the curve must stay below
    # 25 ms x exp(-1.2816 x 0.1) = 21.99 ms: 27 streams (21 ms), not 31.
    assert capacity(p, STANDARD, 10, 0.9, 256) == pytest.approx(27 / (0.1 + 10 * 0.021))


def test_a_tiers_capacity_is_its_replicas_median() -> None:
    ps = [pred(0.010, 16, 0.001), pred(0.010, 16, 0.001), pred(0.040, 16, 0.001)]
    one = capacity(ps[0], STANDARD, 100, AT_THE_CURVE, 256)
    assert tier_capacity(ps, STANDARD, 100, AT_THE_CURVE, 256) == pytest.approx(one)
    assert tier_capacity([], STANDARD, 100, AT_THE_CURVE, 256) == 0.0


def test_a_tier_is_counted_only_up_to_the_streams_it_has_run() -> None:
    """Short answers are best at the SLO's edge (31 streams) by the curve; a replica seen at no
    more than 12 counts 12 (past its frontier the curve is the model's guess)."""
    seen_to_12 = replace(pred(0.010, 16, 0.001), frontier=12)
    assert tier_capacity([seen_to_12], STANDARD, 10, AT_THE_CURVE, 256) == pytest.approx(
        12 / (0.1 + 10 * 0.010))
    assert tier_capacity([pred(0.010, 16, 0.001)], STANDARD, 10, AT_THE_CURVE, 256) == (
        pytest.approx(31 / 0.35))


@pytest.mark.parametrize(
    ("rate", "trend", "startup", "headroom", "want"),
    [
        (10.0, 0.0, 60.0, 0.0, 10.0),
        (10.0, 0.0, 60.0, 0.2, 12.0),
        (10.0, 0.5, 60.0, 0.0, 40.0),  # rising: what it will be once a new replica serves
        (10.0, -0.5, 60.0, 0.0, 10.0),  # falling: not carried (a replica too many is cheaper)
        (0.0, 0.0, 60.0, 0.2, 0.0),
    ],
)
def test_forecast(rate: float, trend: float, startup: float, headroom: float, want: float) -> None:
    assert forecast(rate, trend, startup, headroom) == pytest.approx(want)


# A latency tier fast until 8 streams (5 ms, +1 ms a stream after) and a pool slower per token
# but flat to 64 streams (20 ms, +0.5 ms after). For 100-token answers within 25 ms: a latency
# replica serves 8 / (0.1 + 0.5) = 13.3 requests/s, a pool replica 64 / (0.1 + 2.0) = 30.5; within
# 10 ms only the latency tier serves, 13.3 requests/s (at 8 streams; 13 streams is the edge).
LATENCY = pred(0.005, 8, 0.001)
POOL = pred(0.020, 64, 0.0005)
EXACT = PlanParams(headroom=0.0, startup_s=60.0, attainment=AT_THE_CURVE)


def tiers(lat_min: int = 1, pool_min: int = 1, lat_cost: float = 1.0, lat_prior: bool = True,
          lat_curves: bool = True, maximum: int = 10) -> list[TierSupply]:  # fmt: skip
    return [
        TierSupply("latency", (LATENCY,) if lat_curves else (), LATENCY if lat_prior else None,
                   minimum=lat_min, maximum=maximum, cost=lat_cost),
        TierSupply("pool", (POOL,), None, minimum=pool_min, maximum=maximum),
    ]  # fmt: skip


def standard(rate: float, trend: float = 0.0) -> ClassDemand:
    return ClassDemand("standard", STANDARD, rate, 100, trend)


def tight(rate: float) -> ClassDemand:
    return ClassDemand("tight", TIGHT, rate, 100)


@pytest.mark.parametrize(
    ("case", "supply", "classes", "desired", "unmet"),
    [
        ("nothing to serve: each tier at its minimum", tiers(), [standard(0)], (1, 1), ()),
        ("minimums of 0", tiers(0, 0), [standard(0)], (0, 0), ()),
        # 50/s: the latency replica takes 13.3, the pool 36.7 = 1.2 replicas -> 2; with two
        # latency replicas the pool needs 1, the same cost: the fewer latency replicas win.
        ("standard demand onto the pool", tiers(), [standard(50)], (1, 2), ()),
        # At half the cost, two latency replicas (26.7/s) and one pool replica (23.3/s of its
        # 30.5) cost 2.0, less than one and two (2.5) or four and one (3.0).
        ("a cheaper latency tier takes more", tiers(lat_cost=0.5), [standard(50)], (2, 1), ()),
        # 30/s of the tight class: only the latency tier serves it, 30 / 13.3 = 2.25 -> 3.
        ("a class only the latency tier serves", tiers(), [tight(30)], (3, 1), ()),
        ("both classes", tiers(), [tight(30), standard(50)], (3, 2), ()),
        # No curve for the latency tier yet (a cold start): its prior stands in.
        (
            "a tier with no data plans on its prior",
            tiers(lat_curves=False),
            [tight(30)],
            (3, 1),
            (),
        ),
        # Nothing serves the tight class within 10 ms: unmet, and still answered, by the pool
        # beside the standard class, so planned at 25 ms there: 80 / 30.5 = 2.6 -> 3.
        (
            "a tier with neither: its minimum",
            tiers(lat_curves=False, lat_prior=False),
            [tight(30), standard(50)],
            (1, 3),
            ("tight",),
        ),
        (
            "nothing served at all: nothing to plan it beside",
            tiers(lat_curves=False, lat_prior=False),
            [tight(30)],
            (1, 1),
            ("tight",),
        ),
        ("more than the maximum", tiers(maximum=2), [tight(30)], (2, 2), ("tight",)),
    ],
)
def test_replicas_per_tier(
    case: str, supply: list[TierSupply], classes: list[ClassDemand],
    desired: tuple[int, ...], unmet: tuple[str, ...],
) -> None:  # fmt: skip
    p = plan(supply, classes, EXACT)
    assert tuple(t.desired for t in p.tiers) == desired, case
    assert p.unmet == unmet, case
    for t in p.tiers:
        assert t.desired >= t.load - 1e-9 or p.unmet, case


def test_the_cheapest_plan_serves_every_class_within_capacity() -> None:
    """Whatever the plan, the replicas it asks for hold the demand it planned onto them."""
    p = plan(tiers(), [tight(30), standard(50)], EXACT)
    lat, pool = p.tiers
    assert p.cost == lat.desired + pool.desired
    assert lat.capacity["tight"] == pytest.approx(8 / 0.6)
    assert pool.capacity["tight"] == 0.0
    assert pool.capacity["standard"] == pytest.approx(64 / 2.1)
    # Three latency replicas: 2.25 of them for the tight class, the 0.75 left take 10/s of the
    # standard class (paid for anyway), the pool the other 40/s.
    assert (lat.desired, pool.desired) == (3, 2)
    assert lat.load == pytest.approx(3.0)
    assert pool.load == pytest.approx((50 - 0.75 * 8 / 0.6) / (64 / 2.1))


def test_the_start_up_time_and_headroom_add_replicas() -> None:
    """Demand rising by 0.5/s a second, replicas taking 60 s to start: planned for 80/s, not
    50/s; and 20% headroom on top."""
    still = plan(tiers(), [standard(50)], EXACT)
    rising = plan(tiers(), [standard(50, trend=0.5)], EXACT)
    spare = plan(tiers(), [standard(50, trend=0.5)], PlanParams(0.2, 60.0, AT_THE_CURVE))
    assert rising.demand["standard"] == pytest.approx(80.0)
    assert spare.demand["standard"] == pytest.approx(96.0)
    # 80/s: 13.3 on the latency replica, 66.7 on the pool = 2.2 -> 3 (two latency replicas
    # and two pool ones cost as much: the fewer latency replicas win); 96/s: 82.7 -> 2.7 -> 3.
    assert [t.desired for t in still.tiers] == [1, 2]
    assert [t.desired for t in rising.tiers] == [1, 3]
    assert [t.desired for t in spare.tiers] == [1, 3]
    assert spare.tiers[1].load > rising.tiers[1].load


@pytest.mark.parametrize(
    ("case", "surging", "factor", "demand"),
    [
        ("no surge: the forecast", False, 2.0, 50.0),
        ("a surge: twice the forecast", True, 2.0, 100.0),
        ("a surge, factor 1: the forecast", True, 1.0, 50.0),
        ("a surge, factor 3", True, 3.0, 150.0),
    ],
)
def test_a_surging_class_is_planned_at_the_surge_factor(
    case: str, surging: bool, factor: float, demand: float
) -> None:
    params = PlanParams(0.0, 60.0, AT_THE_CURVE, surge_factor=factor)
    calm = tight(10)  # beside it, not surging: planned at its forecast whatever the factor
    got = plan(tiers(), [replace(standard(50), surge=surging), calm], params)
    assert got.demand["standard"] == pytest.approx(demand), case
    assert got.demand["tight"] == pytest.approx(10.0), case
    # The pool holds what the latency replica (10/s of the tight class, 3.3/s of the
    # standard one in the rest of its time) leaves: 30.5/s a replica.
    assert got.tiers[1].load == pytest.approx((demand - 8 / 0.6 * 0.25) / (64 / 2.1)), case


def test_no_tier_is_an_error() -> None:
    with pytest.raises(ValueError, match="no tier"):
        plan([], [standard(1)], EXACT)


def test_many_tiers_are_planned_by_descent_and_still_serve_the_demand() -> None:
    """Twelve pools, 1..10 replicas each: 10^11 combinations of the first eleven, past the
    exhaustive search. A pool replica serves 64 / 2.1 = 30.5 requests/s; 500 requests/s need
    16.4 replicas' worth: 17 in all, each pool holding at least one, at the least cost of 17."""
    pools = [TierSupply(f"pool-{i}", (POOL,), None, minimum=1, maximum=10) for i in range(12)]
    made = plan(pools, [standard(500)], EXACT)
    per_replica = made.tiers[0].capacity["standard"]
    assert per_replica == pytest.approx(64 / 2.1)
    assert sum(t.desired for t in made.tiers) * per_replica >= 500
    assert made.cost == 17
    assert made.unmet == ()
