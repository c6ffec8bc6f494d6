"""The latency model on a virtual clock: it learns a known curve, follows shifts, stays monotone."""

from __future__ import annotations

import random

import pytest

from gateway.latency_model import (
    AcceptanceRate,
    BackendModel,
    CurveLearner,
    EngineSample,
    isotonic,
    prior_prediction,
)
from gateway.routing import PolicyParams, Role, Slo
from gateway.routing.curves import KNOTS, Curve

SLO = Slo(ttft_s=1.0, tpot_s=0.025)


def true_step(n: float) -> float:
    """A speculative engine's step time: flat while memory-bound, steep past a knee at 24."""
    return 0.019 + 0.00005 * n + 0.0006 * max(0.0, n - 24)


def flat_prior() -> Curve:
    return Curve.of(lambda n: 0.010)


@pytest.mark.parametrize(
    ("values", "weights", "fitted"),
    [
        ([1, 2, 3], [1, 1, 1], [1, 2, 3]),  # already monotone: unchanged
        ([3, 1], [1, 1], [2, 2]),  # one violation: pooled to the mean
        ([3, 1], [3, 1], [2.5, 2.5]),  # ... weighted
        ([1, 5, 2, 2, 6], [1, 1, 1, 1, 1], [1, 3, 3, 3, 6]),
        ([4, 3, 2, 1], [1, 1, 1, 1], [2.5, 2.5, 2.5, 2.5]),
    ],
)
def test_isotonic(values: list[float], weights: list[float], fitted: list[float]) -> None:
    assert isotonic([float(v) for v in values], [float(w) for w in weights]) == pytest.approx(
        fitted
    )


@pytest.mark.parametrize(("n", "expected"), [(0, 1.0), (1, 1.0), (2, 2.0), (5, 5.0), (7, 7.0),
                                             (256, 256.0), (300, 300.0)])  # fmt: skip
def test_curve_interpolates_between_knots_and_extends_past_them(n: int, expected: float) -> None:
    assert Curve.of(float).at(n) == pytest.approx(expected)


def test_learns_a_known_curve_from_noisy_observations() -> None:
    rng = random.Random(1)
    learner = CurveLearner(flat_prior(), prior_weight=1.0, memory=16)
    for _ in range(4000):
        n = rng.uniform(1, 64)
        learner.observe(n, true_step(n) * rng.uniform(0.9, 1.1))
    curve = learner.curve()
    for n in (1, 4, 8, 16, 24, 32, 48, 64):
        assert curve.at(n) == pytest.approx(true_step(n), rel=0.06), n
    assert all(a <= b for a, b in zip(curve.values, curve.values[1:], strict=False))


def test_a_shift_is_followed_where_the_engine_runs() -> None:
    learner = CurveLearner(flat_prior(), prior_weight=1.0, memory=16)
    for _ in range(200):
        learner.observe(16, 0.010)
    for _ in range(40):  # the same load, now twice as slow
        learner.observe(16, 0.020)
    assert learner.curve().at(16) == pytest.approx(0.020, rel=0.05)


def test_noise_cannot_make_more_load_look_faster() -> None:
    learner = CurveLearner(flat_prior(), prior_weight=1.0, memory=16)
    for _ in range(20):
        learner.observe(8, 0.012)
        learner.observe(12, 0.009)  # noisy: faster with more streams
    curve = learner.curve()
    assert curve.at(8) <= curve.at(12)
    assert curve.at(8) == pytest.approx(0.0105, rel=0.05)


def test_past_its_data_the_curve_follows_the_prior_scaled_to_the_data() -> None:
    prior = Curve.of(lambda n: 0.005 + 0.002 * n)
    learner = CurveLearner(prior, prior_weight=1.0, memory=16)
    for _ in range(100):
        learner.observe(8, 0.0105)  # half what the prior says at 8 and 16
        learner.observe(16, 0.0185)
    curve = learner.curve()
    assert curve.at(16) == pytest.approx(0.0185, rel=0.02)
    # past 16, the prior's shape halved: at 32, 0.069 / 2; not the flat continuation of the
    # data, which would promise a flat curve where nothing is known
    assert curve.at(32) == pytest.approx(0.069 / 2, rel=0.03)
    # below the data, no higher than the data
    assert curve.at(1) <= curve.at(8)


def test_acceptance_rate_follows_the_counters_with_a_half_life() -> None:
    acc = AcceptanceRate(halflife_s=3.0)
    acc.observe((0, 0, 0), 0.0)
    drafts = tokens = accepted = 0.0
    t = 0.0
    for _ in range(40):  # 10 s at 2.26 accepted per draft of 5
        t += 0.25
        drafts, tokens, accepted = drafts + 100, tokens + 500, accepted + 226
        acc.observe((drafts, tokens, accepted), t)
    assert acc.tokens_per_step == pytest.approx(3.26)
    assert acc.rate == pytest.approx(0.452)
    for _ in range(80):  # acceptance drops to 0.67 per draft; 20 s later, gone to within 2%
        t += 0.25
        drafts, tokens, accepted = drafts + 100, tokens + 500, accepted + 67
        acc.observe((drafts, tokens, accepted), t)
    assert acc.tokens_per_step == pytest.approx(1.67, rel=0.02)


def test_counters_that_go_down_restart_the_count() -> None:
    acc = AcceptanceRate(halflife_s=3.0)
    acc.observe((100, 500, 200), 0.0)
    acc.observe((10, 50, 40), 1.0)  # the engine restarted
    assert acc.tokens_per_step is None
    acc.observe((20, 100, 60), 2.0)
    assert acc.tokens_per_step == pytest.approx(3.0)


def _scrape_loop(model: BackendModel, tps: float, running: int, t0: float, seconds: float
                 ) -> float:  # fmt: skip
    """Scrapes every 0.25 s of an engine at `running` streams whose step time is true_step and
    whose verification steps emit `tps` tokens each; returns the end time."""
    t, steps, itl_sum, drafts, accepted = t0, 0.0, 0.0, 0.0, 0.0
    if model._last is not None:  # continue the engine's cumulative counters
        last = model._last
        steps, itl_sum = last.itl_count or 0.0, last.itl_sum or 0.0
        drafts, _tokens, accepted = last.spec or (0.0, 0.0, 0.0)
    while t < t0 + seconds:
        t += 0.25
        n_steps = 0.25 / true_step(running)
        steps += n_steps * running
        itl_sum += n_steps * running * true_step(running)
        drafts += n_steps * running
        accepted += n_steps * running * (tps - 1)
        spec = (drafts, drafts * 5, accepted)
        model.observe_engine(EngineSample(running, itl_sum, steps, spec), t)
    return t


def test_an_acceptance_drop_moves_the_whole_tpot_curve_within_seconds() -> None:
    prior = prior_prediction(Role.LATENCY, PolicyParams(), SLO)
    model = BackendModel(prior, prior_weight=0.25, memory=16, halflife_s=3.0)
    t = 0.0
    for running in (1, 8, 16, 24, 32, 48):
        t = _scrape_loop(model, 3.26, running, t, 10.0)
    before = model.prediction()
    assert before.tpot.at(16) == pytest.approx(true_step(16) / 3.26, rel=0.05)
    assert before.tokens_per_step == pytest.approx(3.26, rel=0.01)
    # Acceptance collapses; the engine keeps running 16 streams only. 30 s later:
    t = _scrape_loop(model, 1.67, 16, t, 30.0)
    after = model.prediction()
    assert after.tokens_per_step == pytest.approx(1.67, rel=0.01)
    # Knots it did not visit since moved with the acceptance: the step time is the hardware's.
    for n in (1, 16, 32):
        assert after.tpot.at(n) == pytest.approx(true_step(n) / 1.67, rel=0.05), n
    # (48 was learned from the mean of two scrapes' running counts, 32 and 48: a little high)
    assert after.tpot.at(48) == pytest.approx(true_step(48) / 1.67, rel=0.1)


def test_requests_teach_ttft_and_tpot() -> None:
    prior = prior_prediction(Role.THROUGHPUT, PolicyParams(), SLO)
    model = BackendModel(prior, prior_weight=1.0, memory=16, halflife_s=3.0)
    for i in range(50):
        model.observe_request(float(i), tpot=(20.0, 0.016), ttft=(20, 0.180))
    p = model.prediction()
    assert p.tpot.at(20) == pytest.approx(0.016, rel=0.02)
    assert p.ttft.at(20) == pytest.approx(0.180, rel=0.02)
    assert p.observed_at == 49.0
    assert p.tokens_per_step == 1.0
    assert p.acceptance is None


@pytest.mark.parametrize("role", list(Role))
def test_the_prior_follows_the_configured_limits(role: Role) -> None:
    params = PolicyParams(latency_max_concurrency=16, latency_hard_cap=24)
    lat = prior_prediction(Role.LATENCY, params, SLO).tpot
    thr = prior_prediction(Role.THROUGHPUT, params, SLO).tpot
    # the latency tier is faster inside its golden range, even at the cap, slower past it
    assert lat.at(15) < thr.at(15)
    assert lat.at(16) == pytest.approx(thr.at(16))
    assert lat.at(17) > thr.at(17)
    assert lat.at(24) == pytest.approx(SLO.tpot_s)
    assert prior_prediction(role, params, SLO).ttft.at(1) < SLO.ttft_s
    assert len(KNOTS) == len(lat.values)
