"""The learned policy: tables of (loads, predicted curves, SLO) -> order and reason."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gateway.routing import (
    BackendLoad,
    LoadSnapshot,
    PolicyParams,
    Reason,
    Role,
    RouteRequest,
    RouterState,
    Slo,
    build_policy,
)
from gateway.routing.curves import KNOTS, Curve, Prediction
from gateway.routing.learned import Learned, outlook, speed_bands
from tests.unit.routingfixtures import L0, MODEL, T0, T1, load, names, urls

INTERACTIVE = Slo(ttft_s=1.0, tpot_s=0.012)
STANDARD = Slo(ttft_s=1.0, tpot_s=0.025)
NOW = 1000.0


def eagle(tps: float = 3.26) -> Prediction:
    """A speculative engine: memory-bound to 24 streams, then steep; TPOT = step / tps."""
    step = Curve.of(lambda n: (0.019 + 0.00005 * n + 0.0006 * max(0, n - 24)) / tps)
    return Prediction(tpot=step, ttft=Curve.of(lambda n: 0.15), tokens_per_step=tps,
                      observed_at=NOW)  # fmt: skip


def awq() -> Prediction:
    """A plain AWQ engine: 14 ms, slowly rising."""
    return Prediction(tpot=Curve.of(lambda n: 0.014 + 0.00005 * n),
                      ttft=Curve.of(lambda n: 0.16 + 0.001 * n), observed_at=NOW)  # fmt: skip


def snapshot(l0: BackendLoad, t0: BackendLoad, t1: BackendLoad, tps: float = 3.26,
             observed: float = NOW) -> LoadSnapshot:  # fmt: skip
    curves = {L0.url: replace(eagle(tps), observed_at=observed), T0.url: awq(), T1.url: awq()}
    return LoadSnapshot((L0, T0, T1), {L0.url: l0, T0.url: t0, T1.url: t1}, NOW, curves)


QUIET = PolicyParams(explore_rate=0)
LEARNED = build_policy("learned", QUIET)
assert isinstance(LEARNED, Learned)


def decide(s: LoadSnapshot, slo: Slo = STANDARD, pinned: Role | None = None,
           seed: int = 0) -> tuple[list[str], str]:  # fmt: skip
    d = LEARNED(RouteRequest(MODEL, pinned=pinned, slo=slo), s, RouterState(), random.Random(seed))
    return urls(d), d.reason


def _steps(before: float, after: float) -> Prediction:
    """TPOT `before` at 12 streams, `after` at 13 (the knots are 12 and 16)."""
    curve = Curve(tuple(before if k <= 12 else before + 4 * (after - before) for k in KNOTS))
    return Prediction(tpot=curve, ttft=Curve.of(lambda n: 0.1))


@pytest.mark.parametrize(
    ("slos", "tpots", "meets", "hurt", "gain"),
    [
        # 12 interactive streams at 10 ms; the 13th keeps them all within 12 ms: +1 stream
        (((0.012, 12),), (0.010, 0.010), True, 0, 1 / 0.010),
        # ... the 13th takes them to 13 ms: all 12 pushed past their SLO, and it misses too
        (((0.012, 12),), (0.010, 0.013), False, 12, -12 / 0.010),
        # standard streams (25 ms) are not hurt by 13 ms; the interactive request misses
        (((0.025, 12),), (0.010, 0.013), False, 0, 12 / 0.013 - 12 / 0.010),
        # mixed: the 4 interactive ones are pushed past 12 ms less the 2% margin (hurt, and the
        # request does not meet its SLO with the margin), though still predicted within 12 ms:
        # all 13 count in the gain, the request too
        (((0.012, 4), (0.025, 8)), (0.011, 0.0119), False, 4, 13 / 0.0119 - 12 / 0.011),
        # streams of unknown SLO (another replica's) are taken to have the request's
        ((), (0.010, 0.013), False, 12, -12 / 0.010),
    ],
)
def test_what_one_more_request_would_do_to_a_backend(
    slos: tuple[tuple[float, int], ...], tpots: tuple[float, float], meets: bool, hurt: int,
    gain: float,
) -> None:  # fmt: skip
    o = outlook(L0, BackendLoad(running=12, slos=slos), _steps(*tpots), INTERACTIVE,
                LEARNED.limits)  # fmt: skip
    assert o.meets is meets
    assert o.hurt == hurt
    assert o.gain == pytest.approx(gain)
    assert not o.full


@pytest.mark.parametrize(
    ("lat_load", "slo", "first", "reason"),
    [
        # Light load: the speculative tier is fastest and meets both SLOs.
        (0, STANDARD, L0, Reason.PREDICTED_SLO_MET),
        (0, INTERACTIVE, L0, Reason.PREDICTED_SLO_MET),
        # At 20 streams EAGLE (6.3 ms) still beats AWQ (14 ms): no fixed cap of 16 here.
        (20, STANDARD, L0, Reason.PREDICTED_SLO_MET),
        # At 64 streams EAGLE (14.2 ms) is within 25 ms, but past its knee (one more stream
        # costs the others more output than it adds): AWQ, which meets the SLO too, goes first.
        (63, STANDARD, T0, Reason.PREDICTED_SLO_MET),
    ],
)
def test_fastest_backend_predicted_to_meet_the_slo_goes_first(
    lat_load: int, slo: Slo, first: object, reason: str
) -> None:
    order, why = decide(snapshot(load(lat_load), load(0), load(1)), slo)
    assert order[0] == first.url  # type: ignore[attr-defined]
    assert why == reason
    assert sorted(order) == sorted(names(L0, T0, T1))  # every backend is in the failover order


def test_where_nothing_meets_the_slo_the_request_goes_where_output_is_lost_least() -> None:
    # 12 ms is out of reach: EAGLE at 64 streams (14.2 ms), AWQ at any load (14 ms). Standard
    # streams on EAGLE still meet theirs at 63 streams, but one more pushes EAGLE past 12.9 ...
    slos = ((STANDARD.tpot_s, 63),)
    order, why = decide(snapshot(BackendLoad(running=63, slos=slos), load(5), load(6)),
                        INTERACTIVE)  # fmt: skip
    assert why == Reason.HEADROOM
    # ... slowing 63 streams (output lost) for a request that misses anyway: AWQ loses less.
    assert order[0] != L0.url


def test_low_acceptance_sends_nothing_to_the_latency_tier() -> None:
    # EAGLE accepting little: 19 ms / 1.2 tokens per step = 16 ms, slower than AWQ's 14.
    order, why = decide(snapshot(load(0), load(10), load(12), tps=1.2), STANDARD)
    assert order[0] == T0.url
    assert why == Reason.PREDICTED_SLO_MET


def test_high_acceptance_keeps_the_latency_tier_past_48_streams() -> None:
    order, _ = decide(snapshot(load(48), load(20), load(20), tps=5.0), STANDARD)
    assert order[0] == L0.url


def test_a_request_that_would_push_running_streams_past_their_slo_goes_elsewhere() -> None:
    # The most interactive streams EAGLE holds within 12 ms less the 2% margin, from the curve.
    curve = eagle().tpot
    room = INTERACTIVE.tpot_s * (1 - QUIET.slo_margin)
    edge = next(n for n in range(1, 200) if curve.at(n + 1) > room)
    assert 40 < edge < 64
    running = BackendLoad(running=edge, slos=((INTERACTIVE.tpot_s, edge),))
    # A standard request would fit EAGLE's 25 ms, but would push the interactive ones past 12.
    order, why = decide(snapshot(running, load(30), load(30)), STANDARD)
    assert order[0] != L0.url
    assert why == Reason.PREDICTED_SLO_MET  # AWQ meets the standard SLO without harm
    # One stream fewer, and it joins EAGLE.
    fewer = BackendLoad(running=edge - 1, slos=((INTERACTIVE.tpot_s, edge - 1),))
    order, _ = decide(snapshot(fewer, load(30), load(30)), STANDARD)
    assert order[0] == L0.url


def test_predicted_ttft_far_past_the_slo_is_full_and_admission_holds() -> None:
    slow = Prediction(tpot=Curve.of(lambda n: 0.01), ttft=Curve.of(lambda n: 0.5 * n))
    s = LoadSnapshot((T0,), {T0.url: load(5)}, NOW, {T0.url: slow})
    assert decide(s) == ([T0.url], Reason.SATURATED)  # 3 s predicted > 2 x 1 s
    assert decide(s, Slo(ttft_s=5.0, tpot_s=0.025))[1] == Reason.PREDICTED_SLO_MET


def test_a_long_scraped_queue_is_full_as_for_every_policy() -> None:
    s = snapshot(load(60), load(1, 9), load(1, 12))
    order, why = decide(s, INTERACTIVE)
    assert order[0] == L0.url
    assert why == Reason.HEADROOM


def test_pinned_requests_stay_in_their_tier() -> None:
    order, why = decide(snapshot(load(0), load(0), load(0)), STANDARD, pinned=Role.THROUGHPUT)
    assert set(order) == {T0.url, T1.url}
    assert why == Reason.PINNED


def test_no_backend() -> None:
    s = LoadSnapshot((L0,), {L0.url: load(healthy=False)}, NOW, {})
    assert decide(s) == ([], Reason.NO_BACKEND)


def test_a_backend_without_predictions_is_ranked_after_the_modelled_ones() -> None:
    s = LoadSnapshot((L0, T0), {L0.url: load(0), T0.url: load(50)}, NOW, {T0.url: awq()})
    assert decide(s)[0] == [T0.url, L0.url]


def test_exploration_tries_a_backend_not_observed_lately() -> None:
    policy = build_policy("learned", PolicyParams(explore_rate=1.0, explore_after_s=10))
    req = RouteRequest(MODEL, slo=STANDARD)
    stale = snapshot(load(0), load(0), load(1), tps=1.2, observed=NOW - 30)
    d = policy(req, stale, RouterState(), random.Random(0))
    assert d.primary == L0
    assert d.reason == Reason.EXPLORE
    fresh = snapshot(load(0), load(0), load(1), tps=1.2, observed=NOW - 5)
    d = policy(req, fresh, RouterState(), random.Random(0))
    assert d.primary == T0
    assert d.reason == Reason.PREDICTED_SLO_MET


def test_the_decision_is_a_pure_function_of_its_inputs() -> None:
    policy = build_policy("learned", PolicyParams())
    s = snapshot(load(10), load(3), load(3), observed=NOW - 60)
    req = RouteRequest(MODEL, slo=STANDARD)
    runs = []
    for _ in range(2):
        rng = random.Random(7)
        runs.append([policy(req, s, RouterState(), rng) for _ in range(200)])
    assert runs[0] == runs[1]
    # identical throughput backends are tie-broken at random, not by configuration order
    firsts = {d.candidates[1].url for d in runs[0] if d.reason == Reason.PREDICTED_SLO_MET}
    assert firsts == {T0.url, T1.url}


def test_an_engine_with_no_time_per_token_is_ranked_not_a_crash() -> None:
    # Streams that arrive whole (or an instant engine) teach a TPOT of 0.
    instant = Prediction(tpot=Curve.of(lambda n: 0.0), ttft=Curve.of(lambda n: 0.001))
    s = LoadSnapshot((T0, T1), {T0.url: load(3), T1.url: load(1)}, NOW,
                     {T0.url: instant, T1.url: instant})  # fmt: skip
    order, why = decide(s)
    assert order == [T1.url, T0.url]
    assert why == Reason.PREDICTED_SLO_MET


@pytest.mark.parametrize(
    ("tpots", "bands"),
    [
        ([], []),
        ([0.014], [0]),
        ([0.014, 0.0145, 0.006], [1, 1, 0]),  # two AWQ engines alike, EAGLE faster
        ([0.0140, 0.0146, 0.0152], [0, 0, 1]),  # 5% from the band's first, not chained on
        ([0.020, 0.010, 0.0104, 0.0109], [2, 0, 0, 1]),
    ],
)
def test_speed_bands(tpots: list[float], bands: list[int]) -> None:
    assert speed_bands(tpots) == bands


def test_alike_backends_go_by_load_even_across_a_band_edge_of_their_own() -> None:
    # Two AWQ engines the model sees 3% apart: the less loaded goes first, not the "faster".
    slow = Prediction(tpot=Curve.of(lambda n: 0.0144), ttft=Curve.of(lambda n: 0.1))
    fast = Prediction(tpot=Curve.of(lambda n: 0.0140), ttft=Curve.of(lambda n: 0.1))
    s = LoadSnapshot((T0, T1), {T0.url: load(5), T1.url: load(1)}, NOW,
                     {T0.url: fast, T1.url: slow})  # fmt: skip
    assert decide(s)[0] == [T1.url, T0.url]
