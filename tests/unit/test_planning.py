"""The planner at work (gateway.serve.planning), on a virtual clock: what it reads of each tier
(learned curves, replicas in rotation, bounds), the demand the request path feeds it, and what
it publishes."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import PlannerConfig, Settings
from gateway.observe.telemetry import Telemetry
from gateway.planner.demand import class_name
from gateway.routing.curves import Curve, Prediction
from gateway.routing.types import Slo
from gateway.serve.planning import Planning

LAT, POOL_A, POOL_B = "http://eagle:1", "http://awq-a:1", "http://awq-b:1"
SLO = Slo(ttft_s=1.0, tpot_s=0.025)
# TPOT rising with streams, a 50 ms TTFT: meets 25 ms up to ~15 streams.
RISING = Prediction(Curve.of(lambda n: 0.010 + 0.001 * n), Curve.of(lambda n: 0.05), frontier=32)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def build(**replicas: Any) -> tuple[Planning, Registry, Telemetry, Clock]:
    settings = Settings(
        tiers=[
            {"name": "eagle", "role": "latency", "backends": [{"url": LAT, "models": ["m"]}],
             "replicas": replicas.get("eagle", {})},
            {"name": "awq", "role": "throughput",
             "backends": [{"url": u, "models": ["m"]} for u in (POOL_A, POOL_B)],
             "replicas": replicas.get("awq", {})},
        ],
        planner={"tau_s": 5.0, "startup_s": 0.0, "headroom": 0.0},
    )  # fmt: skip
    telemetry, clock = Telemetry(), Clock()
    registry = Registry(settings, MemoryInflightStore(), telemetry, clock)
    # Throughput tier listed first: the planner puts the latency tier first all the same.
    tiers = list(reversed(settings.tiers))
    return Planning(settings.planner, tiers, registry, telemetry, clock), registry, telemetry, clock


def feed(planning: Planning, clock: Clock, rate: float, seconds: float) -> None:
    """Arrivals of SLO's class at `rate` per second, each finished with 100 tokens."""
    start, n = clock.now, int(rate * seconds)
    for i in range(1, n + 1):
        clock.now = start + i / rate
        planning.demand.arrived(SLO, clock.now)
        planning.demand.finished(SLO, 100, clock.now)


@pytest.mark.parametrize(
    ("case", "curves", "ejected", "replicas", "floor"),
    [
        ("nothing learned: no fewer than in rotation", {}, (), {}, {"eagle": 1, "awq": 2}),
        ("nothing learned, one ejected: the two in rotation", {}, (POOL_B,), {},
         {"eagle": 1, "awq": 1}),
        ("nothing learned, more in rotation than the maximum: the maximum", {}, (),
         {"awq": {"maximum": 1}}, {"eagle": 1, "awq": 1}),
        ("learned: the configured minimum", {LAT: RISING, POOL_A: RISING}, (),
         {"awq": {"minimum": 0}}, {"eagle": 1, "awq": 0}),
    ],
)  # fmt: skip
def test_what_the_planner_reads_of_each_tier(
    case: str, curves: dict[str, Prediction], ejected: tuple[str, ...], replicas: dict[str, Any],
    floor: dict[str, int],
) -> None:  # fmt: skip
    planning, registry, _, _ = build(**replicas)
    registry.curves = curves
    for url in ejected:
        registry.eject(registry.entry(url), "test")
    supplies = planning.supplies()
    assert [s.name for s in supplies] == ["eagle", "awq"], case
    assert {s.name: s.minimum for s in supplies} == floor, case
    assert {s.name: len(s.curves) for s in supplies} == {
        "eagle": int(LAT in curves), "awq": int(POOL_A in curves) + int(POOL_B in curves)}, case


def test_more_demand_asks_for_more_replicas_and_it_is_published() -> None:
    planning, registry, telemetry, clock = build(awq={"minimum": 1, "maximum": 20})
    registry.curves = {LAT: RISING, POOL_A: RISING, POOL_B: RISING}
    feed(planning, clock, rate=5.0, seconds=60.0)
    low = planning.step()
    feed(planning, clock, rate=100.0, seconds=60.0)
    high = planning.step()
    desired = {t.name: t.desired for t in high.tiers}
    assert sum(desired.values()) > sum(t.desired for t in low.tiers)
    name = class_name(SLO)
    assert high.demand[name] == pytest.approx(100.0, rel=0.15)
    r = telemetry.registry
    for t in high.tiers:
        assert r.get_sample_value("tiergate_tier_desired_replicas", {"tier": t.name}) == t.desired
        load = r.get_sample_value("tiergate_tier_planned_load_replicas", {"tier": t.name})
        assert load == pytest.approx(t.load)
        cap = r.get_sample_value("tiergate_tier_replica_capacity_rps",
                                 {"tier": t.name, "slo_class": name})  # fmt: skip
        assert cap == pytest.approx(t.capacity[name])
        assert cap > 0
    assert r.get_sample_value("tiergate_tier_replicas", {"tier": "awq"}) == 2
    assert r.get_sample_value("tiergate_demand_rps", {"slo_class": name}) == pytest.approx(
        high.demand[name])
    assert r.get_sample_value("tiergate_demand_unmet", {"slo_class": name}) == 0


def test_a_class_no_tier_serves_is_published_as_unmet() -> None:
    planning, registry, telemetry, clock = build()
    registry.curves = {LAT: RISING, POOL_A: RISING}
    tight = Slo(ttft_s=1.0, tpot_s=0.005)  # faster than either tier at one stream
    for i in range(50):
        clock.now = i * 0.1
        planning.demand.arrived(tight, clock.now)
    made = planning.step()
    assert made.unmet == (class_name(tight),)
    value = telemetry.registry.get_sample_value("tiergate_demand_unmet",
                                                {"slo_class": class_name(tight)})  # fmt: skip
    assert value == 1


@pytest.mark.parametrize(
    ("planner", "surge_s"),
    [({}, 5.0), ({"tau_s": 8.0}, 2.0), ({"tau_s": 8.0, "surge_tau_s": 7.0}, 7.0)],
)
def test_the_surge_average_by_default_and_set(planner: dict[str, float], surge_s: float) -> None:
    assert PlannerConfig.model_validate(planner).surge_s == surge_s


def test_a_surge_average_no_shorter_than_tau_is_refused() -> None:
    with pytest.raises(ValueError, match="surge_tau_s: must be shorter than tau_s"):
        PlannerConfig.model_validate({"tau_s": 8.0, "surge_tau_s": 8.0})


def test_a_surge_is_logged_once_at_its_start(caplog: pytest.LogCaptureFixture) -> None:
    planning, registry, _, clock = build()
    registry.curves = {LAT: RISING, POOL_A: RISING, POOL_B: RISING}
    feed(planning, clock, 2.0, 30.0)
    with caplog.at_level("INFO", logger="gateway.serve.planning"):
        planning.step()
        assert not caplog.records
        feed(planning, clock, 40.0, 1.0)
        planning.step()
        feed(planning, clock, 40.0, 0.5)
        planning.step()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"demand surge in class {class_name(SLO)}: ")
