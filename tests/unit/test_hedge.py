"""Hedging a slow first token (gateway.pipeline.hedge): the deadline and the hedge's backend."""

from __future__ import annotations

import pytest

from gateway.config.settings import HedgeConfig
from gateway.pipeline.hedge import hedge_after, hedge_backend
from gateway.routing import Backend, Role
from gateway.routing.curves import Curve, Prediction


def ttft(seconds: float) -> Prediction:
    return Prediction(tpot=Curve.of(lambda n: 0.01), ttft=Curve.of(lambda n: seconds * n))


@pytest.mark.parametrize(
    ("cfg", "candidates", "after"),
    [
        (HedgeConfig(), [(None, 4)], 1.0),  # nothing learned: the floor
        (HedgeConfig(), [(ttft(0.1), 2)], 1.0),  # 3 x 0.2 s is under the floor
        (HedgeConfig(), [(ttft(0.1), 8)], pytest.approx(2.4)),  # 3 x 0.8 s
        (HedgeConfig(factor=2, min_s=0.5), [(ttft(0.1), 4)], pytest.approx(0.8)),
        # the least of the candidates: a backend learned slow does not set the wait
        (HedgeConfig(), [(ttft(1.0), 8), (ttft(0.1), 8), (None, 3)], pytest.approx(2.4)),
        (HedgeConfig(enabled=False), [(ttft(0.1), 8)], None),
    ],
)
def test_the_deadline_follows_the_least_predicted_ttft(
    cfg: HedgeConfig, candidates: list[tuple[Prediction | None, int]], after: object
) -> None:
    assert hedge_after(cfg, candidates) == after


def _backends(n: int) -> tuple[Backend, ...]:
    return tuple(Backend(f"http://b{i}", "t", Role.THROUGHPUT, frozenset({"m"})) for i in range(n))


@pytest.mark.parametrize(
    ("current", "unusable", "hedge"),
    [
        ("http://b0", set(), "http://b1"),  # the policy's next choice
        ("http://b1", set(), "http://b2"),
        ("http://b2", set(), "http://b0"),  # the last: the first usable before it
        ("http://b0", {"http://b1"}, "http://b2"),  # ejected or failed: skipped
        ("http://b0", {"http://b1", "http://b2"}, None),
        ("http://gone", set(), "http://b0"),
    ],
)
def test_the_hedge_goes_to_the_next_usable_candidate(
    current: str, unusable: set[str], hedge: str | None
) -> None:
    b = hedge_backend(_backends(3), current, unusable)
    assert (b.url if b else None) == hedge
