"""`bench affinity`'s goals: the hit rate judged in the steady state, from cold and at a common
mix of turns, each against the better peer on that figure; the common mix itself."""

from __future__ import annotations

import math
from typing import Any

import pytest

from loadtests.affinity import AFFINITY, BASE, at_common_mix, same_mix, verdicts


def _arm(steady: float, cold: float, p50: float = 50.0, peak: float = 4) -> dict[str, Any]:
    return {"hit_rate": steady, "hit_rate_cold": cold, "hit_rate_mix": steady,
            "ttft_p50_ms": p50, "ttft_p99_ms": 2 * p50, "peak": peak}  # fmt: skip


@pytest.mark.parametrize(
    ("ours", "smg", "router", "steady", "cold"),
    [
        # the cold start's first prefills on more engines: behind from cold only
        (_arm(0.946, 0.944), _arm(0.946, 0.946), _arm(0.86, 0.86), "MET", "NOT MET"),
        (_arm(0.947, 0.947), _arm(0.946, 0.946), _arm(0.86, 0.86), "MET", "MET"),
        (_arm(0.940, 0.944), _arm(0.946, 0.940), _arm(0.86, 0.86), "NOT MET", "MET"),
        # each figure against the peer that is better on it
        (_arm(0.90, 0.90), _arm(0.89, 0.80), _arm(0.85, 0.91), "MET", "NOT MET"),
    ],
)
def test_hit_rate_goals_in_both_regimes(
    ours: dict[str, Any], smg: dict[str, Any], router: dict[str, Any], steady: str, cold: str
) -> None:
    arms = {BASE: _arm(0.8, 0.8, p50=60), AFFINITY: ours, "smg:cache_aware": smg,
            "vllm-router:cache_aware": router}  # fmt: skip
    got = {v["goal"]: v["result"] for v in verdicts(arms, bound=7)}
    assert got["hit rate at least the better peer's"] == steady
    assert got["hit rate from cold at least the better peer's"] == cold
    assert got["hit rate with affinity above without"] == "MET"
    assert got["no engine above affinity's bound"] == "MET"


def test_equal_to_the_shown_digits_counts_as_at_least() -> None:
    ours, smg = _arm(0.94640, 0.94), _arm(0.94670, 0.945)
    ours["hit_rate_mix"], smg["hit_rate_mix"] = 0.944051, 0.944049 + 1e-6
    arms = {AFFINITY: ours, "smg:cache_aware": smg}
    got = {v["goal"]: v["result"] for v in verdicts(arms, bound=7)}
    assert got["cached at a common turn mix at least the better peer's"] == "MET"
    assert got["hit rate at least the better peer's"] == "NOT MET"


def _run(*by_turn: tuple[float, float]) -> dict[str, Any]:
    return {"by_turn": [list(t) for t in by_turn]}


@pytest.mark.parametrize(
    ("runs", "weights"),
    [
        # each turn's share of every arm's prompt tokens, rounds pooled
        ({"a": [_run((100, 90), (300, 290))], "b": [_run((300, 280), (300, 290))]},
         [0.4, 0.6]),
        ({"a": [_run((100, 90), (100, 95)), _run((100, 90), (100, 95))]}, [0.5, 0.5]),
        # a turn no arm reached
        ({"a": [_run((100, 90), (0, 0))]}, [1.0, 0.0]),
        ({"a": [_run((0, 0), (0, 0))]}, [0.0, 0.0]),
    ],
)
def test_the_common_mix(runs: dict[str, list[dict[str, Any]]], weights: list[float]) -> None:
    assert at_common_mix(runs) == pytest.approx(weights)


@pytest.mark.parametrize(
    ("by_turn", "weights", "share"),
    [
        # the same turns' shares at the same weights: equal, whatever the arm's own mix
        ([(100, 90), (900, 855)], [0.5, 0.5], 0.925),
        ([(900, 810), (100, 95)], [0.5, 0.5], 0.925),
        ([(100, 90), (100, 95)], [0.25, 0.75], 0.9375),
        # a turn the arm did not reach is left out, the others' weights renormalised
        ([(100, 90), (0, 0)], [0.5, 0.5], 0.9),
    ],
)
def test_same_mix(by_turn: list[tuple[float, float]], weights: list[float], share: float) -> None:
    assert same_mix(by_turn, weights) == pytest.approx(share)


def test_same_mix_of_nothing_is_nan() -> None:
    assert math.isnan(same_mix([(0, 0)], [1.0]))
