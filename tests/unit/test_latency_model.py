"""The latency model on a virtual clock: it learns a known curve from nothing, fits the
engine's roofline, extrapolates within the optimistic and pessimistic bounds past its frontier,
follows shifts, stays monotone, and measures the spread of requests around it."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable

import pytest

from gateway.backends.latency_model import (
    UNKNOWN,
    AcceptanceRate,
    BackendModel,
    CurveLearner,
    EngineSample,
    LogSpread,
    Roofline,
    beyond,
    fit_roofline,
    isotonic,
    prompt_per_step,
    with_mate,
)
from gateway.routing.curves import KNOTS, TABLE_MAX, Curve, Prediction


def true_step(n: float) -> float:
    """A speculative engine's step time: flat while memory-bound, steep past a knee at 24."""
    return 0.019 + 0.00005 * n + 0.0006 * max(0.0, n - 24)


def model() -> BackendModel:
    return BackendModel(memory=16, halflife_s=3.0, spread=0.1, ridge_max=2048)


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


def test_a_curve_given_by_its_table_reads_its_knots_from_it() -> None:
    table = [0.001 * n for n in range(TABLE_MAX + 1)]
    curve = Curve.tabled(table)
    assert curve.at(7) == pytest.approx(0.007)
    assert curve.values[-1] == pytest.approx(0.256)
    assert curve.at(300) == pytest.approx(0.300)  # straight on past the table
    with pytest.raises(ValueError, match="table"):
        Curve(curve.values, table=(1.0, 2.0))


def test_learns_a_known_curve_from_noisy_observations() -> None:
    rng = random.Random(1)
    learner = CurveLearner(memory=16)
    for _ in range(4000):
        n = rng.uniform(1, 64)
        learner.observe(n, true_step(n) * rng.uniform(0.9, 1.1))
    points = dict(learner.points())
    for n in (1, 4, 8, 16, 24, 32, 48, 64):
        assert points[n] == pytest.approx(true_step(n), rel=0.06), n
    values = list(points.values())
    assert values == sorted(values)


def test_nothing_is_known_before_the_first_observation_which_sets_its_knots() -> None:
    learner = CurveLearner(memory=16)
    assert learner.points() == []
    learner.observe(11, 0.010)  # between the knots 10 and 12: both take it, not 0
    assert learner.points() == [(10, pytest.approx(0.010)), (12, pytest.approx(0.010))]
    assert not learner.observe(math.nan, 0.010)
    assert not learner.observe(8, -1.0)


@pytest.mark.parametrize(
    ("readings", "at_6"),
    [
        # A first reading past the load seen, next to a knot that has seen it: it counts beside
        # the neighbour's value believed as one observation, not as the knot's whole truth.
        ([(6, 0.015)], pytest.approx(0.0125)),
        # Two readings there: two thirds of the way.
        ([(6, 0.015), (6, 0.015)], pytest.approx(0.01 + 0.005 * 2 / 3)),
        # Split with its neighbour (n = 5: half each), as a gradient step of the line.
        ([(5, 0.015)], pytest.approx(0.01 + 0.0025 / 1.5)),
        # Many: the readings, the neighbour's belief forgotten as any old reading is.
        ([(6, 0.015)] * 40, pytest.approx(0.015, rel=0.01)),
    ],
)
def test_a_knots_first_reading_next_to_a_seen_one_is_weighed_against_it(
    readings: list[tuple[int, float]], at_6: float
) -> None:
    learner = CurveLearner(memory=16)
    for _ in range(16):
        learner.observe(4, 0.010)
    for n, y in readings:
        learner.observe(n, y)
    assert dict(learner.points())[6] == at_6


# Steps of a pool engine that decodes in 14 ms, crowding near the knot at 16: the readings that
# carried prefills scatter to 60 ms (drawn once from those four loads and four values).
_CROWDED = [
    (18.0, 0.016), (16.2, 0.036), (16.1, 0.06), (18.0, 0.014), (16.1, 0.036), (18.0, 0.014),
    (16.2, 0.036), (18.0, 0.016), (18.0, 0.014), (16.2, 0.06), (16.5, 0.06), (16.2, 0.036),
    (16.5, 0.016), (16.2, 0.016), (18.0, 0.016), (16.5, 0.06), (16.2, 0.014), (18.0, 0.036),
    (16.1, 0.014), (16.1, 0.036), (16.5, 0.016), (16.2, 0.036), (16.1, 0.06), (16.1, 0.036),
    (16.1, 0.016), (16.5, 0.014), (16.2, 0.014), (18.0, 0.016), (16.1, 0.036), (18.0, 0.016),
]


@pytest.mark.parametrize(
    ("case", "readings"),
    [
        # The line through the knots at 16 and 20, fitted to these, put 20 at 5 ms.
        ("crowded near one knot", _CROWDED),
        ("the same, reversed", _CROWDED[::-1]),
        ("on the knot itself", [(16.0, y) for _, y in _CROWDED]),
    ],
)
def test_a_knot_stays_within_the_readings_that_moved_it(
    case: str, readings: list[tuple[float, float]]
) -> None:
    """Readings that crowd near one knot of a segment and scatter tilt the line its two knots
    are fitted as; its far end once swung to values no reading had (a pool engine's knots at
    -30 and 121 ms, their isotonic fit 9.7 ms flat: docs/results/little-12ms-seeds)."""
    learner = CurveLearner(memory=16)
    for n, y in readings:
        learner.observe(n, y)
    for knot in (16, 20):
        i = KNOTS.index(knot)
        if learner.seen[i]:
            assert 0.014 <= learner.values[i] <= 0.060, (case, knot)


def test_a_knots_bounds_count_its_neighbours_value_and_follow_a_rescale() -> None:
    """A knot's first reading beside a seen knot counts the neighbour's value as one reading
    (docs/results/knot-neighbour): between the two, not at the reading."""
    learner = CurveLearner(memory=16)
    for _ in range(16):
        learner.observe(4, 0.010)
    learner.observe(6, 0.015)
    assert learner.values[KNOTS.index(6)] == pytest.approx(0.0125)
    # An acceptance shift rescales the knots and what bounds them alike (bounds left as they
    # were would hold the knot at 0.022 here).
    learner.scale(2.0)
    learner.observe(6, 0.022)
    assert learner.values[KNOTS.index(6)] == pytest.approx(0.024)


def test_a_shift_is_followed_where_the_engine_runs() -> None:
    learner = CurveLearner(memory=16)
    for _ in range(200):
        learner.observe(16, 0.010)
    for _ in range(40):  # the same load, now twice as slow
        learner.observe(16, 0.020)
    assert dict(learner.points())[16] == pytest.approx(0.020, rel=0.05)


def test_noise_cannot_make_more_load_look_faster() -> None:
    learner = CurveLearner(memory=16)
    for _ in range(20):
        learner.observe(8, 0.012)
        learner.observe(12, 0.009)  # noisy: faster with more streams
    points = dict(learner.points())
    assert points[8] <= points[12]
    assert points[8] == pytest.approx(0.0105, rel=0.05)


@pytest.mark.parametrize(
    ("truth", "xs"),
    [
        (Roofline(0.010), (1, 8, 16)),  # flat
        (Roofline(0.010, 0.0002), (1, 4, 8, 16, 32)),  # memory-bound, a gentle slope
        (Roofline(0.019, 0.00005, 0.0006, 24), (1, 8, 16, 24, 32, 48, 64)),  # a knee at 24
        (Roofline(0.005, 0.0, 0.001, 16), (1, 8, 16, 32, 64)),  # flat, then rising
    ],
)
def test_a_roofline_is_recovered_from_its_points(truth: Roofline, xs: tuple[int, ...]) -> None:
    fit = fit_roofline([(x, truth.at(x), 1.0) for x in xs])
    for n in (1, *xs, 2 * xs[-1]):
        assert fit.at(n) == pytest.approx(truth.at(n), rel=1e-6), n


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([(4, 0.003, 1.0)], Roofline(0.003)),  # one point: flat
        ([(4, 0.003, 1.0), (8, 0.002, 1.0)],  # falling
         Roofline((1 / 0.003 + 1 / 0.002) / (1 / 0.003**2 + 1 / 0.002**2))),
    ],
)
def test_a_roofline_never_falls(points: list[tuple[int, float, float]],
                                expected: Roofline) -> None:  # fmt: skip
    fit = fit_roofline(points)
    assert fit.slope == fit.steeper == 0.0
    # flat at the mean weighted by 1 / value^2 (relative errors)
    assert fit.base == pytest.approx(expected.base)


def test_fitting_roofs_to_noisy_points_is_robust_to_one_outlier() -> None:
    xs = (1, 2, 3, 4, 6, 8, 12, 16)
    rng = random.Random(3)
    points = [(x, true_step(x) * rng.uniform(0.98, 1.02), 4.0) for x in xs]
    points[3] = (4, true_step(4) * 1.10, 1.0)  # one knot seen once, and high
    fit = fit_roofline(points)
    assert fit.at(16) == pytest.approx(true_step(16), rel=0.03)
    assert fit.at(16) - fit.at(1) < 0.002  # the slope stays gentle


@pytest.mark.parametrize(("n", "frontier", "tokens", "mean", "var"), [
    # half-way up the prior's span in logs: E[X] = U^2 / 2L, E[X^2] = U^3 / 3L
    (16, 8, 8.0, math.log(2) ** 2 / (2 * math.log(256)),
     math.log(2) ** 3 / (3 * math.log(256)) - (math.log(2) ** 2 / (2 * math.log(256))) ** 2),
    # past the span (n's tokens beyond ridge_max): X uniform on [U - L, U]
    (256, 1, 8.0, math.log(256) - math.log(256) / 2, math.log(256) ** 2 / 12),
])  # fmt: skip
def test_the_doubt_past_the_frontier(n: int, frontier: int, tokens: float, mean: float,
                                     var: float) -> None:  # fmt: skip
    line = [0.010] * (TABLE_MAX + 1)
    table, doubt = beyond(line, frontier, tokens, ridge_max=tokens * 256)
    assert table[n] == pytest.approx(0.010 * math.exp(mean))
    assert doubt[n] == pytest.approx(math.sqrt(var))


def test_past_the_frontier_the_curve_rises_and_grows_unsure() -> None:
    line = [0.010 + 0.0001 * n for n in range(TABLE_MAX + 1)]  # the observed line, continued
    table, doubt = beyond(line, 8, 8.0, 2048.0)
    assert len(table) == len(doubt) == TABLE_MAX + 1
    assert table[:9] == line[:9]  # as observed to the frontier, without doubt
    assert doubt[:9] == [0.0] * 9
    # one stream past it: nearly the observed line; a doubling: markedly slower, and unsure
    assert table[9] == pytest.approx(line[9], rel=0.01)
    assert table[16] > line[16] * 1.03
    assert 0 < doubt[9] < doubt[16] < doubt[64] < doubt[256]
    assert table == sorted(table)


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
    m = model()
    t = 0.0
    for running in (1, 8, 16, 24, 32, 48):
        t = _scrape_loop(m, 3.26, running, t, 10.0)
    before = m.prediction()
    assert before.frontier == 48
    assert before.tpot.at(16) == pytest.approx(true_step(16) / 3.26, rel=0.05)
    assert before.tokens_per_step == pytest.approx(3.26, rel=0.01)
    # Acceptance collapses; the engine keeps running 16 streams only. 30 s later:
    t = _scrape_loop(m, 1.67, 16, t, 30.0)
    after = m.prediction()
    assert after.tokens_per_step == pytest.approx(1.67, rel=0.01)
    # Where it did not run since, the curve moved with the acceptance: the step time is the
    # hardware's. (The roofline, fitted to six loads, is within a few percent of the truth.)
    for n in (1, 16, 32, 48):
        assert after.tpot.at(n) == pytest.approx(true_step(n) / 1.67, rel=0.08), n


def test_nothing_observed_is_unknown() -> None:
    m = model()
    assert m.prediction() is UNKNOWN
    assert not UNKNOWN.known
    m.observe_request(0.0, None, (1, 0.2))  # a TTFT alone says nothing of TPOT
    assert not m.prediction().known


def test_scrapes_move_the_frontier_by_what_held_through_the_interval() -> None:
    m = model()
    m.observe_engine(EngineSample(running=4, itl_sum=0.0, itl_count=0.0), 0.0)
    m.observe_engine(EngineSample(running=10, itl_sum=0.02 * 50, itl_count=50.0), 0.25)
    p = m.prediction()
    assert p.frontier == 4  # 4 at one end, 10 at the other
    assert p.tpot.at(4) == pytest.approx(0.020)  # learned at the mean, 7: a flat roofline
    assert p.tpot.at(7) > 0.020  # past the frontier: the ridge may lie anywhere
    assert p.doubt[7] > 0 == p.doubt[4]
    m.observe_engine(EngineSample(running=10, itl_sum=0.02 * 100, itl_count=100.0), 0.5)
    assert m.prediction().frontier == 10
    # Idle, or a counter that restarted: nothing learned, the frontier stays.
    m.observe_engine(EngineSample(running=0, itl_sum=0.02 * 100, itl_count=100.0), 0.75)
    m.observe_engine(EngineSample(running=0, itl_sum=0.0, itl_count=0.0), 1.0)
    assert m.prediction().frontier == 10


def test_a_burst_between_two_scrapes_teaches_nothing() -> None:
    """30 streams came and went between two scrapes that each saw one: their steps' samples
    would be read at the scrapes' load, a busy step taught to a quiet engine. The gateway's
    leases saw the burst (their count weighted by itself): the interval is not learned from."""
    burst = 30.0 * 30.0 * 0.1  # 30 leases for 0.1 s: the integral of the count's square
    m = model()
    m.observe_engine(EngineSample(running=1, itl_sum=0.0, itl_count=0.0,
                                  leases=(0.0, 0.0, 1)), 0.0)  # fmt: skip
    # Quiet: one stream, steps of 20 ms.
    m.observe_engine(EngineSample(running=1, itl_sum=0.02 * 10, itl_count=10.0,
                                  leases=(0.2, 0.2, 1)), 0.2)  # fmt: skip
    # The burst: 30 streams for 0.1 s, 300 samples of 40 ms steps; one stream at the scrape.
    m.observe_engine(EngineSample(running=1, itl_sum=0.2 + 0.04 * 300, itl_count=310.0,
                                  leases=(0.3 + 3.0, 0.3 + burst, 1)), 0.4)  # fmt: skip
    p = m.prediction()
    assert p.tpot.at(1) == pytest.approx(0.020)  # not 40 ms
    assert p.tpot.evidence_at(1) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("ends", "count", "square", "waiting", "learned"),
    [
        ((10, 10), 1.0, 10.0, (0.0, 0.0), True),  # 10 leases throughout
        ((10, 10), 1.0, 15.0, (0.0, 0.0), True),  # 15 as the streams saw it: 10 x 1.5
        ((10, 10), 1.0, 16.5, (0.0, 0.0), False),  # more: a burst between the scrapes
        ((4, 10), 1.0, 16.0, (0.0, 0.0), True),  # up to the greater end x 1.5 + 1
        ((10, 10), 1.0, 6.0, (0.0, 0.0), True),  # down to the lesser end / 1.5 - 1
        ((10, 10), 1.0, 5.5, (0.0, 0.0), False),  # a lull between the scrapes
        ((10, 10), 1.0, 30.0, (3.0, 5.0), True),  # queued at both: the running count says
        ((10, 10), 1.0, 30.0, (3.0, 0.0), False),  # queued at one only
        ((0, 0), 0.0, 0.0, (0.0, 0.0), True),  # no lease of ours: other clients' load
    ],
)
def test_an_interval_is_learned_from_where_the_load_held_between_the_scrapes(
    ends: tuple[int, int], count: float, square: float, waiting: tuple[float, float],
    learned: bool,
) -> None:
    """`count`, `square`: the integrals of the gateway's lease count and of its square over the
    interval (their ratio: the load its streams saw); `ends`: the counts at the scrapes."""
    m = model()
    first = EngineSample(running=10, itl_sum=0.0, itl_count=0.0, waiting=waiting[0],
                         leases=(0.0, 0.0, ends[0]))  # fmt: skip
    second = EngineSample(running=10, itl_sum=0.02 * 100, itl_count=100.0, waiting=waiting[1],
                          leases=(count, square, ends[1]))  # fmt: skip
    m.observe_engine(first, 0.0)
    m.observe_engine(second, 0.1)
    assert m.prediction().known is learned
    if learned:
        assert m.prediction().tpot.evidence_at(10) > 0  # at the running count


def test_past_the_data_the_truth_lies_within_the_doubt() -> None:
    m = model()
    for n in range(1, 9):  # 8 streams seen of an engine whose knee is at 24 streams
        for _ in range(20):
            m.observe_request(0.0, (float(n), true_step(n)), None)
    p = m.prediction()
    assert p.frontier == 8
    for n in range(1, 9):
        assert p.tpot.at(n) == pytest.approx(true_step(n), rel=0.02)
    # Past it, the truth (flat to 24, then steep) within two deviations of the prediction,
    # the doubt's and the spread's; the prediction rises, and its doubt with it.
    for n in (9, 12, 16, 24, 32, 48, 64):
        deviation = math.sqrt(p.doubt[n] ** 2 + p.spread**2)
        assert abs(math.log(true_step(n) / p.tpot.at(n))) <= 2 * deviation, n
    assert p.doubt[9] < p.doubt[24] < p.doubt[64]


def test_requests_teach_ttft_and_tpot() -> None:
    m = model()
    for i in range(50):
        m.observe_request(float(i), tpot=(20.0, 0.016), ttft=(20, 0.180))
    p = m.prediction()
    assert p.frontier == 20
    assert p.tpot.at(20) == pytest.approx(0.016, rel=0.02)
    assert p.ttft.at(20) == pytest.approx(0.180, rel=0.02)
    assert p.ttft.at(200) == pytest.approx(0.180, rel=0.02)  # flat past its data
    assert p.observed_at == 49.0
    assert p.tokens_per_step == 1.0
    assert p.acceptance is None


@pytest.mark.parametrize(
    ("seen", "below"),
    [
        # Seen only in a burst, steeply: the line through it would reach nothing (10 ms at 10
        # streams, 20 at 16: -5 ms at one); below the fewest streams seen it stays flat.
        ([(10.0, 0.010), (16.0, 0.020)], 0.010),
        # Seen at 12 and 16, gently: flat below 12 at what the fit gives there.
        ([(12.0, 0.015), (16.0, 0.016)], 0.015),
        # Seen from one stream on: the line as fitted (a rise from 1 to 4 streams).
        ([(1.0, 0.010), (4.0, 0.013)], None),
    ],
)
def test_below_the_fewest_streams_seen_the_curve_is_flat(
    seen: list[tuple[float, float]], below: float | None
) -> None:
    m = model()
    for i in range(40):
        n, y = seen[i % len(seen)]
        m.observe_request(float(i), tpot=(n, y), ttft=None)
    p = m.prediction()
    low = int(seen[0][0])
    for n in range(0, low + 1):
        assert p.tpot.at(n) > 0
        assert p.tpot.at(n) == pytest.approx(p.tpot.at(low))
        if below is not None:
            assert p.tpot.at(n) == pytest.approx(below, rel=0.05)
    if below is None:
        assert p.tpot.at(4) > p.tpot.at(1)


@pytest.mark.parametrize(("sigma", "mu"), [(0.02, 0.0), (0.05, 0.03), (0.2, -0.1)])
def test_the_spread_is_measured_in_logs(sigma: float, mu: float) -> None:
    rng = random.Random(7)
    spread = LogSpread(memory=2000, prior=0.1, prior_weight=2.0)
    for _ in range(3000):
        spread.observe(math.exp(rng.gauss(mu, sigma)))
    assert spread.bias == pytest.approx(mu, abs=0.01)
    assert spread.deviation == pytest.approx(sigma, rel=0.1)
    spread.observe(0.0)  # not a ratio: ignored
    spread.observe(math.inf)
    assert spread.deviation == pytest.approx(sigma, rel=0.1)


def test_requests_scattered_around_the_curve_show_their_spread() -> None:
    rng = random.Random(2)
    m = model()
    for _ in range(20):
        m.observe_request(0.0, (16.0, 0.010), None)
    m.prediction()  # residuals are read against the curve published last
    for _ in range(400):
        m.observe_request(0.0, (16.0, 0.010 * math.exp(rng.gauss(0.0, 0.05))), None)
    p = m.prediction()
    assert p.spread == pytest.approx(0.05, rel=0.25)
    assert abs(p.bias) < 0.02
    # Streams past what the published curve had seen teach the curve, not the spread.
    m.observe_request(0.0, (64.0, 0.5), None)
    assert m.prediction().spread == pytest.approx(p.spread, rel=0.01)


def test_an_engine_with_no_time_per_token_teaches_no_spread() -> None:
    m = model()
    for _ in range(5):
        m.observe_request(0.0, (2.0, 0.0), (2, 0.001))  # whole answers at once: TPOT 0
    assert m.prediction().tpot.at(2) == 0.0
    m.observe_request(0.0, (2.0, 0.001), None)  # against a curve at 0: no ratio, no crash
    m.observe_request(0.0, (2.0, 0.0), None)
    assert m.prediction().spread == pytest.approx(0.1)


def _seen(upto: int, step: Callable[[float], float] = true_step) -> Prediction:
    """A model that has seen 1..`upto` streams of an engine whose step is `step`."""
    m = model()
    for n in range(1, upto + 1):
        for _ in range(20):
            m.observe_request(0.0, (float(n), step(n)), None)
    return m.prediction()


def test_a_tier_mate_that_has_seen_nothing_more_tells_nothing() -> None:
    own, mate = _seen(8), _seen(8)
    assert with_mate(own, mate, 0.1) is own
    assert with_mate(own, _seen(4), 0.1) is own
    assert with_mate(own, UNKNOWN, 0.1) is own
    assert with_mate(UNKNOWN, own, 0.1) is UNKNOWN


@pytest.mark.parametrize("unlike", [0.0, 0.05, 0.1, 0.3, 2.0])
def test_a_tier_mate_narrows_the_guess_past_the_frontier(unlike: float) -> None:
    own, mate = _seen(4), _seen(32)
    told = with_mate(own, mate, unlike)
    assert told.frontier == own.frontier == 4  # what was seen is its own
    assert told.tpot.table[:5] == own.tpot.table[:5]
    assert told.doubt[:5] == own.doubt[:5]
    for n in range(5, TABLE_MAX + 1):
        # The two guesses combined: surer than its own guess and never below the curve so far.
        assert told.doubt[n] <= own.doubt[n] + 1e-12
        assert told.tpot.table[n] >= told.tpot.table[n - 1]
    # The truth past its own frontier, as far as the mate saw, within the narrower doubt.
    for n in (6, 12, 24, 32):
        deviation = math.sqrt(told.doubt[n] ** 2 + told.spread**2)
        assert abs(math.log(true_step(n) / told.tpot.at(n))) <= 2 * deviation, n
    if unlike == 0.0:  # trusted as its own: the mate's curve, from the mate's level on
        ratio = own.tpot.table[4] / mate.tpot.table[4]
        assert told.tpot.at(24) == pytest.approx(mate.tpot.at(24) * ratio)
        assert told.doubt[24] == 0.0
    if unlike == 2.0:  # a stranger: nearly its own guess
        assert told.doubt[64] == pytest.approx(own.doubt[64], rel=0.2)


@pytest.mark.parametrize("unlike", [0.0, 0.1, 2.0])
def test_past_what_the_mate_has_seen_its_guess_is_not_counted_twice(unlike: float) -> None:
    # Both guesses there are ridge priors, the mate's the better informed: the less doubtful
    # one is taken, never a combination surer than either.
    own, mate = _seen(3), _seen(8)
    told = with_mate(own, mate, unlike)
    ratio = own.tpot.table[3] / mate.tpot.table[3]
    for n in (9, 16, 46, TABLE_MAX):
        guess = math.hypot(mate.doubt[n], unlike * math.log(n / 3))
        assert told.doubt[n] == pytest.approx(min(guess, own.doubt[n]))
        taken = mate.tpot.table[n] * ratio if guess < own.doubt[n] else own.tpot.table[n]
        # (a stranger's: its own guess; the curve only rises)
        assert told.tpot.table[n] == pytest.approx(max(taken, told.tpot.table[n - 1]))
    if unlike == 0.0:  # a replica: as sure, and as fast, far out as the mate scaled
        assert told.doubt[46] == pytest.approx(mate.doubt[46])


def test_an_unlike_mate_is_scaled_to_the_backends_own_level() -> None:
    def slower(n: float) -> float:
        return 1.5 * true_step(n)

    own, mate = _seen(8, slower), _seen(32)
    told = with_mate(own, mate, 0.0)
    assert told.tpot.at(8) == pytest.approx(slower(8), rel=0.02)
    # ... and shaped as the mate's curve past that
    assert told.tpot.at(24) / told.tpot.at(8) == pytest.approx(mate.tpot.at(24) / mate.tpot.at(8))


@pytest.mark.parametrize("told_when", [True, False])
def test_a_stream_timed_as_acceptance_falls_counts_the_fall_once(told_when: bool) -> None:
    """Streams that decoded just after acceptance fell, while the average still lags: read at
    the acceptance they ran at, the curve ends where the truth is once the average has caught
    up; read at the lagging average, they are rescaled again and stay too slow (the fall
    counted twice)."""
    m = model()
    t = 0.0
    for tps in [3.26] * 40 + [1.67] * 8:  # 10 s steady, then 2 s after the fall
        t = _scrape_loop(m, tps, 16, t, 0.25)
        since = t - 1.0 if told_when else None
        m.observe_request(t, (16.0, true_step(16) / tps), None, since)
    assert m.tps is not None
    assert m.tps > 2.0  # the average lags the fall
    # It catches up; no step time is scraped meanwhile (the engine reads another load, or its
    # interval is not steady), so nothing else corrects the knot.
    assert m._last is not None
    assert m._last.spec is not None
    drafts, _, accepted = m._last.spec
    for _ in range(120):
        t += 0.25
        drafts, accepted = drafts + 100, accepted + 67
        m.observe_engine(EngineSample(16, None, None, (drafts, drafts * 5, accepted)), t)
    assert m.tps == pytest.approx(1.67, rel=0.01)
    at_16 = m.prediction().tpot.at(16)
    truth = true_step(16) / 1.67
    if told_when:
        assert at_16 == pytest.approx(truth, rel=0.05)
    else:
        assert at_16 > truth * 1.1


@pytest.mark.parametrize(("last_tps", "converted"), [(3.26 * 1.01, False), (3.26 * 0.7, True)])
def test_a_streams_usual_scatter_of_acceptance_is_not_divided_out(
    last_tps: float, converted: bool
) -> None:
    """Outside a shift, a stream's acceptance differs from the average mostly by what its own
    drafts add to it: a ratio within that usual scatter is shrunk to nothing; a shift's is
    not."""
    m = model()
    t = 0.0
    for i in range(200):
        t = _scrape_loop(m, 3.26 * (1.01 if i % 2 else 0.99), 16, t, 0.25)
        m.observe_request(t, (16.0, 0.006), None, t - 0.25)
    assert m.lag.deviation < 0.02  # learned: the ratio scatters by ~1%
    t = _scrape_loop(m, last_tps, 16, t, 0.25)
    told, untold = copy.deepcopy(m), copy.deepcopy(m)
    told.observe_request(t, (16.0, 0.006), None, t - 0.25)
    untold.observe_request(t, (16.0, 0.006), None)
    assert (told.tpot.values != untold.tpot.values) is converted


def test_a_streams_acceptance_is_read_from_the_counters_of_its_own_time() -> None:
    acc = AcceptanceRate(halflife_s=3.0)
    assert acc.tokens_per_step_since(0.0) is None  # nothing scraped
    acc.observe((0, 0, 0), 0.0)
    acc.observe((100, 500, 300), 1.0)  # 4 tokens per step
    acc.observe((200, 1000, 350), 2.0)  # then 1.5
    assert acc.tokens_per_step_since(1.0) == pytest.approx(1.5)
    assert acc.tokens_per_step_since(0.5) == pytest.approx(1 + 350 / 200)
    assert acc.tokens_per_step_since(-5.0) == pytest.approx(1 + 350 / 200)  # older: all kept
    assert acc.tokens_per_step_since(2.5) == pytest.approx(1.5)  # after the last: the last
    acc.observe((200, 1000, 350), 3.0)  # nothing drafted since
    assert acc.tokens_per_step_since(2.5) is None
    acc.observe((10, 50, 20), 4.0)  # a restart: the counts before it are no base
    assert acc.tokens_per_step_since(0.0) is None
    acc.observe((20, 100, 40), 5.0)
    assert acc.tokens_per_step_since(0.0) == pytest.approx(3.0)


# -- prefill among the decodes ---------------------------------------------------------------

PREFILL_S = 1e-4  # per prompt token computed


def decode_step(n: float) -> float:
    """A throughput engine's decode step: flat-ish, steeper past 24 streams."""
    return 0.0136 + 0.0001 * n + 0.00025 * max(0.0, n - 24)


def waves(m: BackendModel, rng: random.Random, prefilled: bool, scrapes: int = 600) -> None:
    """Scrapes of an engine whose prompts come in waves with the load: at 24 streams mostly
    (the burst's new conversations), at 8 little; each interval's steps carry its prefill."""
    itl_sum = itl_count = prompt = t = 0.0
    for i in range(scrapes):
        n = (8.0, 16.0, 24.0)[i // 40 % 3]
        if i % 40 == 0:  # the load changes at a scrape (no interval of two loads is learned)
            m.observe_engine(EngineSample(running=n, itl_sum=itl_sum, itl_count=itl_count,
                                          prefilled=prompt if prefilled else None), t)  # fmt: skip
        per_step_tokens = rng.choice((0.0, 50.0, 100.0)) * (n / 8) ** 2
        steps = 0.25 / decode_step(n)
        itl_count += steps * n  # one sample per stream and step
        itl_sum += steps * n * (decode_step(n) + PREFILL_S * per_step_tokens)
        prompt += steps * per_step_tokens
        t += 0.25
        m.observe_engine(EngineSample(running=n, itl_sum=itl_sum, itl_count=itl_count,
                                      prefilled=prompt if prefilled else None), t)  # fmt: skip


def test_the_prefill_among_the_decodes_is_learned_and_taken_out_of_the_curve() -> None:
    """Prompts prefilled in waves that grow with the load would make the curve rise with the
    waves: at 24 streams more than twice the decode step. Read less their prefill, the
    intervals teach the decode step, and the cost per prompt token is the engine's."""
    told, blind = model(), model()
    waves(told, random.Random(1), prefilled=True)
    waves(blind, random.Random(1), prefilled=False)
    assert told.prefill.per_token == pytest.approx(PREFILL_S, rel=0.02)
    assert blind.prefill.per_token == 0.0
    for n in (8, 16, 24):
        assert told.prediction().tpot.at(n) == pytest.approx(decode_step(n), rel=0.03)
    assert blind.prediction().tpot.at(24) > 2 * decode_step(24)


def test_the_cost_per_prompt_token_is_learned_within_each_load_not_across_loads() -> None:
    """Where the prefill rises with the load exactly as the decode step does, a regression
    across loads would read the decode step's rise as prefill; within each load there is
    none to read until the prefill varies there."""
    m = model()
    itl_sum = itl_count = prompt = t = 0.0
    for i in range(300):
        n = (8.0, 16.0, 24.0)[i // 20 % 3]
        steps = 0.25 / decode_step(n)
        itl_count, prompt, t = itl_count + steps * n, prompt + steps * 10 * n, t + 0.25
        itl_sum += steps * n * (decode_step(n) + PREFILL_S * 10 * n)
        m.observe_engine(EngineSample(running=n, itl_sum=itl_sum, itl_count=itl_count,
                                      prefilled=prompt), t)  # fmt: skip
    assert m.prefill.per_token == 0.0
    assert m.prediction().tpot.at(24) == pytest.approx(decode_step(24) + PREFILL_S * 240,
                                                       rel=0.03)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "hits", "restart_at", "per_interval", "learned"),
    [
        ("prompts of varied sizes", 0.0, None, 1, PREFILL_S),
        # Half of each prompt found in the prefix cache: only what was computed costs.
        ("half of each prompt cached", 0.5, None, 1, PREFILL_S),
        # The engine restarts mid-way: its counters fall, that interval is no evidence.
        ("a restart", 0.0, 150, 1, PREFILL_S),
        ("every prompt alike", None, None, 1, 0.0),
        # Five prefills in each quarter second, each timed with the others: they shared steps.
        ("prefills that overlapped", 0.0, None, 5, 0.0),
    ],
)
def test_a_prompt_tokens_prefill_time_is_learned_from_the_engines_prefill_times(
    case: str, hits: float | None, restart_at: int | None, per_interval: int, learned: float
) -> None:
    """vLLM's prefill-time histogram (one sample per request, from its first scheduling to
    its first token) against its prompt tokens computed (`request_prefill_kv_computed_tokens`):
    within a load, each prompt token computed adds PREFILL_S to its request's prefill, on top
    of the step it shares; prefills that took longer together than the interval, none."""
    rng, m = random.Random(3), model()
    computed = took = count = t = 0.0
    for i in range(300):
        if i == restart_at:
            computed = took = count = 0.0
        n = (8.0, 16.0, 24.0)[i // 20 % 3]
        for _ in range(per_interval):  # requests prefilled in the interval
            size = 600.0 if hits is None else rng.choice((50.0, 300.0, 1200.0))
            new = size - (0.0 if hits is None else size * hits)
            computed, count = computed + new, count + 1
            # (Prefills that share the steps are each timed with the others' tokens too.)
            took += (decode_step(n) + PREFILL_S * new) * per_interval
        t += 0.25
        m.observe_engine(EngineSample(running=n, prefill=(took, computed, count)), t)
    assert m.prompt.per_token == pytest.approx(learned, rel=0.02, abs=1e-9), case


def test_a_streams_tpot_is_learned_as_it_was_taken() -> None:
    """A stream decodes over many steps, a prefill wave among them diluted: what it took,
    the usual prefill beside it, is taught to the curve as it is."""
    m = model()
    waves(m, random.Random(2), prefilled=True)
    assert m.prefill.per_token > 0

    def took(n: int) -> float:
        return decode_step(n) + PREFILL_S * 300

    for _ in range(40):
        for n in (8, 16, 24):
            m.observe_request(150.0, (float(n), took(n)), None, since=149.0)
    for n in (8, 16, 24):
        assert m.prediction().tpot.at(n) == pytest.approx(took(n), rel=0.1)  # not 1/3 of it


@pytest.mark.parametrize(
    ("samples", "prefilled", "learned"),
    [
        (2.0, 12_000.0, False),  # 0 -> 30 streams, 2 samples: most were prefilling a wave
        (14.0, 12_000.0, False),  # fewer samples than the 15 streams it is read at
        (15.0, 12_000.0, True),  # a step's worth for each: decoding at this load
        (2.0, 0.0, True),  # no prefill: a slow step of decoding is what it says
    ],
)
def test_an_interval_whose_streams_were_mostly_prefilling_teaches_no_decode_step(
    samples: float, prefilled: float, learned: bool,
) -> None:
    """A burst of new prompts on an idle engine: at the next scrape 30 streams run, but the
    interval gave fewer inter-token samples than that, each a step that carried the wave's
    prefill (121 ms where the engine decodes 30 streams in 50: a burst of 30 conversations
    against `tiergate up`'s latency engine). Read at 15 streams, such a knot stood above the
    curve past it and moved later turns of the conversations off an engine with room."""
    m = model()
    m.observe_engine(EngineSample(running=0, itl_sum=0.0, itl_count=0.0, prefilled=0.0), 0.0)
    m.observe_engine(EngineSample(running=30, itl_sum=0.121 * samples, itl_count=samples,
                                  prefilled=prefilled), 0.25)  # fmt: skip
    assert (sum(m.tpot.seen) > 0) is learned


@pytest.mark.parametrize(
    ("case", "last", "now", "running", "per_step"),
    [
        # The engine counts its steps: 986 prompt tokens over its 8 steps, whatever ran.
        ("steps counted", EngineSample(running=5, itl_count=0, prefilled=0, steps=100),
         EngineSample(running=22, itl_count=40, prefilled=986, steps=108), 13.5, 986 / 8),
        # It does not: one inter-token sample per stream decoding in a step, as if all were.
        ("steps not counted", EngineSample(running=5, itl_count=0, prefilled=0),
         EngineSample(running=22, itl_count=40, prefilled=986), 13.5, 986 * 13.5 / 40),
        # Counted at one scrape only (an engine restarted, or its page changed): the guess.
        ("steps at one end", EngineSample(running=5, itl_count=0, prefilled=0),
         EngineSample(running=5, itl_count=50, prefilled=100, steps=10), 5.0, 100 * 5 / 50),
        ("no step between", EngineSample(running=5, itl_count=0, prefilled=0, steps=10),
         EngineSample(running=5, itl_count=50, prefilled=100, steps=10), 5.0, 100 * 5 / 50),
        ("nothing prefilled", EngineSample(running=5, itl_count=0, prefilled=300, steps=10),
         EngineSample(running=5, itl_count=50, prefilled=300, steps=20), 5.0, 0.0),
    ],
)
def test_the_prompt_tokens_of_a_step(
    case: str, last: EngineSample, now: EngineSample, running: float, per_step: float
) -> None:
    assert prompt_per_step(last, now, running) == pytest.approx(per_step), case


def test_an_interval_a_burst_began_in_is_read_less_the_prefill_of_its_own_steps() -> None:
    """5 streams decoding at 20 ms a step, 17 more admitted and prefilled over 8 steps (986
    prompt tokens): read over the engine's steps, the decode step is what is left; guessed
    from the streams running at the two scrapes, three times the prefill would come off."""
    for steps, floor in ((True, False), (False, True)):  # counted; guessed (floored)
        m = model()
        m.prefill.sxx, m.prefill.sxy = 1.0, PREFILL_S  # the cost per prompt token, learned
        decode = 0.020
        step_s = decode + PREFILL_S * 986 / 8
        first, then = (100, 108) if steps else (None, None)
        m.observe_engine(EngineSample(running=5, itl_sum=0.0, itl_count=0, prefilled=0,
                                      steps=first), 0.0)  # fmt: skip
        m.observe_engine(EngineSample(running=22, itl_sum=40 * step_s, itl_count=40,
                                      prefilled=986, steps=then), 0.25)  # fmt: skip
        read = [v for _, v in m.tpot.points()]
        assert read
        if floor:
            assert read[0] < 0.5 * decode
        else:
            assert read[0] == pytest.approx(decode, rel=1e-6)
