"""The learned policy: tables of (loads, predicted curves, SLO) -> order and reason."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import pytest

from gateway.backends.latency_model import UNKNOWN, beyond
from gateway.routing import (
    Backend,
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
from gateway.routing.curves import KNOTS, TABLE_MAX, Curve, Prediction
from gateway.routing.filters import eligible, pinned
from gateway.routing.learned import (
    REACH,
    RETOLD,
    SHORTLIST,
    TIGHTER,
    Learned,
    TighterClasses,
    _any_between,
    _least_placed,
    candidates,
    envelope,
    first_stream,
    guard,
    kept_for_tighter,
    met,
    most_streams,
    outlook,
    output,
    peak,
    remember_outlooks,
    remember_peaks,
    shortlist,
)
from tests.unit.routingfixtures import L0, MODEL, T0, T1, load, names, urls

INTERACTIVE = Slo(ttft_s=1.0, tpot_s=0.012)
STANDARD = Slo(ttft_s=1.0, tpot_s=0.025)
NOW = 1000.0
SHARP = 0.001  # a spread so small that a stream meets its SLO exactly when the curve does


def eagle(tps: float = 3.26, spread: float = SHARP) -> Prediction:
    """A speculative engine: memory-bound to 24 streams, then steep; TPOT = step / tps."""
    step = Curve.of(lambda n: (0.019 + 0.00005 * n + 0.0006 * max(0, n - 24)) / tps)
    return Prediction(tpot=step, ttft=Curve.of(lambda n: 0.15), tokens_per_step=tps,
                      observed_at=NOW, spread=spread)  # fmt: skip


def awq() -> Prediction:
    """A plain AWQ engine: 14 ms, slowly rising."""
    return Prediction(tpot=Curve.of(lambda n: 0.014 + 0.00005 * n),
                      ttft=Curve.of(lambda n: 0.16 + 0.001 * n), observed_at=NOW,
                      spread=SHARP)  # fmt: skip


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


@pytest.mark.parametrize(
    ("slo", "tpot", "bias", "spread", "p"),
    [
        (0.012, 0.012, 0.0, 0.05, 0.5),  # at the curve's mean: one in two
        (0.012, 0.010, 0.0, 0.001, 1.0),  # well within, a sharp curve
        (0.012, 0.013, 0.0, 0.001, 0.0),
        # one deviation (in logs) below the SLO: 84%
        (0.012, 0.012 * math.exp(-0.05), 0.0, 0.05, 0.8413),
        # ... but streams run 5% slower than the curve says (bias): one in two again
        (0.012, 0.012 * math.exp(-0.05), 0.05, 0.05, 0.5),
    ],
)
def test_the_probability_of_meeting_an_slo(slo: float, tpot: float, bias: float, spread: float,
                                           p: float) -> None:  # fmt: skip
    pred = Prediction(tpot=Curve.of(lambda n: tpot), ttft=Curve.of(lambda n: 0.1), bias=bias,
                      spread=spread)  # fmt: skip
    assert met(math.log(slo), 1, pred) == pytest.approx(p, abs=1e-4)
    assert met(math.log(slo), 300, pred) == pytest.approx(p, abs=1e-4)  # past the table
    # The model's own doubt about the curve widens the spread: at one deviation below the SLO
    # with as much doubt as spread, the chance is Phi(1 / sqrt(2)) = 76%, not 84%.
    doubtful = replace(pred, doubt=(spread,) * len(pred.tpot.table))
    if bias == 0.0 and spread == 0.05 and tpot < slo:
        assert met(math.log(slo), 1, doubtful) == pytest.approx(0.7602, abs=1e-4)
    instant = Prediction(tpot=Curve.of(lambda n: 0.0), ttft=Curve.of(lambda n: 0.1))
    assert met(math.log(slo), 1, instant) == 1.0  # an engine with no time per token
    # The rows a decision reads per candidate are the tables it would read one by one.
    for p_ in (pred, doubtful, instant):
        assert p_.rows == tuple(zip(p_.tpot.table, p_.ttft.table, p_.offset, p_.z_scale,
                                    strict=True))  # fmt: skip


def _steps(before: float, after: float, spread: float = SHARP) -> Prediction:
    """TPOT `before` at 12 streams, `after` at 13 (drawn straight to the next knot)."""
    step = next(k for k in KNOTS if k > 12) - 12
    curve = Curve(tuple(before if k <= 12 else before + step * (after - before) for k in KNOTS))
    return Prediction(tpot=curve, ttft=Curve.of(lambda n: 0.1), spread=spread)


@pytest.mark.parametrize(
    ("slos", "tpots", "p", "gain"),
    [
        # 12 interactive streams at 10 ms; the 13th keeps them all within 12 ms: +1 stream
        (((0.012, 12),), (0.010, 0.010), 1.0, 1 / 0.010),
        # ... the 13th takes them to 13 ms: all 12 pushed past their SLO, and it misses too
        (((0.012, 12),), (0.010, 0.013), 0.0, -12 / 0.010),
        # standard streams (25 ms) are not hurt by 13 ms; the interactive request misses
        (((0.025, 12),), (0.010, 0.013), 0.0, 12 / 0.013 - 12 / 0.010),
        # mixed: the 4 interactive ones are pushed past 12 ms; 8 standard ones and the request
        # (interactive, so it misses too) are not
        (((0.012, 4), (0.025, 8)), (0.011, 0.0125), 0.0, 8 / 0.0125 - 12 / 0.011),
        # streams of unknown SLO (another replica's) are taken to have the request's
        ((), (0.010, 0.013), 0.0, -12 / 0.010),
    ],
)
def test_what_one_more_request_would_do_to_a_backend(
    slos: tuple[tuple[float, int], ...], tpots: tuple[float, float], p: float, gain: float,
) -> None:  # fmt: skip
    o = outlook(L0, BackendLoad(running=12, slos=slos), _steps(*tpots), INTERACTIVE,
                LEARNED.limits)  # fmt: skip
    assert o.p == pytest.approx(p, abs=1e-6)
    assert o.gain == pytest.approx(gain)
    assert not o.full
    assert not o.ahead


@pytest.mark.parametrize(
    "lb",
    [
        BackendLoad(),
        BackendLoad(inflight=3),
        BackendLoad(running=5, waiting=2, inflight=1),  # others beside ours
        BackendLoad(running=5, waiting=2, inflight=1, inflight_at_scrape=1),
        BackendLoad(running=5, inflight=4, inflight_at_scrape=6),  # ours ended since
        BackendLoad(running=9, waiting=3, inflight=2, stale=True),  # only ours then
        BackendLoad(running=1, inflight=4),
    ],
)
def test_an_outlook_reads_the_backends_effective_load(lb: BackendLoad) -> None:
    # (spelled out in the outlook for speed: it must stay what `effective` says)
    assert outlook(L0, lb, _steps(0.010, 0.013), INTERACTIVE, LEARNED.limits).load == lb.effective


def test_at_the_slo_the_gain_counts_streams_by_their_chance() -> None:
    # The curve sits at 12 ms with and without the request: every stream meets it one time in
    # two, the request too: the expected output of 13 half-streams against 12.
    o = outlook(L0, BackendLoad(running=12, slos=((0.012, 12),)),
                _steps(0.012, 0.012, 0.05), INTERACTIVE, LEARNED.limits)  # fmt: skip
    assert o.p == pytest.approx(0.5)
    assert o.gain == pytest.approx(0.5 / 0.012)


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
def test_the_backend_where_the_request_adds_most_goes_first(
    lat_load: int, slo: Slo, first: object, reason: str
) -> None:
    order, why = decide(snapshot(load(lat_load), load(0), load(1)), slo)
    assert order[0] == first.url  # type: ignore[attr-defined]
    assert why == reason
    assert sorted(order) == sorted(names(L0, T0, T1))  # every backend is in the failover order


def test_both_tiers_meeting_the_slo_the_faster_one_keeps_filling_before_its_knee() -> None:
    # EAGLE at 16 streams (6.1 ms) and an idle AWQ (14 ms) both meet 25 ms: one more stream on
    # EAGLE adds more output per second than one on AWQ (goodput, not the SLO, decides).
    order, why = decide(snapshot(load(16), load(0), load(0)), STANDARD)
    assert order[0] == L0.url
    assert why == Reason.PREDICTED_SLO_MET


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


@pytest.mark.parametrize(("tps", "first"), [(5.0, Role.LATENCY), (1.5, Role.THROUGHPUT)])
def test_acceptance_decides_how_far_the_latency_tier_fills(tps: float, first: Role) -> None:
    # 22 streams, before the step's knee at 24: accepting 5 tokens a step, one more stream there
    # adds more than a first one on an idle AWQ; accepting 1.5, less.
    d = LEARNED(RouteRequest(MODEL, slo=STANDARD), snapshot(load(22), load(0), load(0), tps=tps),
                RouterState(), random.Random(0))  # fmt: skip
    assert d.primary is not None
    assert d.primary.role is first


def test_a_request_that_would_push_running_streams_past_their_slo_goes_elsewhere() -> None:
    # The most interactive streams EAGLE holds within 12 ms, from the curve.
    pred = eagle()
    edge = next(n for n in range(1, 200) if pred.tpot.at(n + 1) > INTERACTIVE.tpot_s)
    assert 40 < edge < 64
    running = BackendLoad(running=edge, slos=((INTERACTIVE.tpot_s, edge),))
    # A standard request would fit EAGLE's 25 ms, but would push the interactive ones past 12.
    order, why = decide(snapshot(running, load(30), load(30)), STANDARD)
    assert order[0] != L0.url
    assert why == Reason.PREDICTED_SLO_MET  # AWQ meets the standard SLO without harm
    pushed = outlook(L0, running, pred, STANDARD, LEARNED.limits)
    assert pushed.p == 1.0  # the request itself would meet 25 ms, but every other stream is lost
    assert pushed.gain < -(edge // 2) / pred.tpot.at(edge)
    # Two streams fewer, and no one is pushed (the curve then stays 1.5% within 12 ms): the
    # request adds its own output, less what it slows the others.
    fewer = BackendLoad(running=edge - 2, slos=((INTERACTIVE.tpot_s, edge - 2),))
    assert 0 < outlook(L0, fewer, pred, STANDARD, LEARNED.limits).gain < 1 / pred.tpot.at(edge)


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


@pytest.mark.parametrize(
    ("l0", "latency_first", "why"),
    [
        # Past its batch limit with a queue: every stream there misses its SLO already, so one
        # more loses nothing there, and it drew every request (its queue growing) while the
        # pool, at its edge, would lose output by one more. Full: last, after the pool.
        (load(256, 1000, inflight=1256), False, Reason.HEADROOM),
        (load(256, 9), False, Reason.HEADROOM),  # just past max_waiting (8)
        (load(20, 8), True, Reason.PREDICTED_SLO_MET),  # a queue within it: not full
        # A stale scrape's queue is old news: the in-flight count alone (20) ranks it.
        (load(256, 1000, inflight=20, stale=True), True, Reason.PREDICTED_SLO_MET),
    ],
)
def test_a_queue_in_a_latency_engine_is_full_as_in_a_pool_engine(
    l0: BackendLoad, latency_first: bool, why: str
) -> None:
    edge = next(n for n in range(1, 400) if awq().tpot.at(n + 1) > STANDARD.tpot_s)
    at_edge = BackendLoad(running=edge, slos=((STANDARD.tpot_s, edge),))
    order, reason = decide(snapshot(l0, at_edge, at_edge), STANDARD)
    assert (order[0] == L0.url, reason) == (latency_first, why)
    if not latency_first:
        assert order[-1] == L0.url


def test_pinned_requests_stay_in_their_tier() -> None:
    order, why = decide(snapshot(load(0), load(0), load(0)), STANDARD, pinned=Role.THROUGHPUT)
    assert set(order) == {T0.url, T1.url}
    assert why == Reason.PINNED


def test_no_backend() -> None:
    s = LoadSnapshot((L0,), {L0.url: load(healthy=False)}, NOW, {})
    assert decide(s) == ([], Reason.NO_BACKEND)


# -- several classes at once -------------------------------------------------------------------
def _with(running: int, *slos: tuple[Slo, int], waiting: int = 0) -> BackendLoad:
    # Tightest first, as the registry keeps them.
    return BackendLoad(running=running, waiting=waiting,
                       slos=tuple(sorted((slo.tpot_s, count) for slo, count in slos)))  # fmt: skip


# EAGLE (the fixture's curve) holds 12 ms up to 53 streams; AWQ never; both 25 ms. For a standard
# request alone, EAGLE adds the most output up to ~25 streams (see above).
@pytest.mark.parametrize(
    ("l0", "t0", "t1", "first", "why"),
    [
        # 20 standard streams on EAGLE, 35 interactive ones on AWQ missing theirs: with the
        # request and the 35 that belong on EAGLE, 56 streams there would miss 12 ms. AWQ meets
        # 25 ms: the standard request goes there.
        (_with(20, (STANDARD, 20)), _with(35, (INTERACTIVE, 35)), load(0), T1,
         Reason.RESERVED),
        # ... the same with no interactive stream anywhere: EAGLE fills to its own knee.
        (_with(20, (STANDARD, 20)), _with(35, (STANDARD, 35)), load(0), L0,
         Reason.PREDICTED_SLO_MET),
        # ... or with fewer of them: 20 + 1 + 25 streams keep 12 ms.
        (_with(20, (STANDARD, 20)), _with(25, (INTERACTIVE, 25)), load(0), L0,
         Reason.PREDICTED_SLO_MET),
        # Interactive streams on EAGLE count as placed: 20 there, 10 on AWQ (31 with the request).
        (_with(20, (INTERACTIVE, 20)), _with(10, (INTERACTIVE, 10)), load(0), L0,
         Reason.PREDICTED_SLO_MET),
        # ... 20 there and 40 on AWQ (61).
        (_with(20, (INTERACTIVE, 20)), _with(40, (INTERACTIVE, 40)), load(0), T1,
         Reason.RESERVED),
        # Nowhere else meets 25 ms without loss (the pool's queues are full): EAGLE takes it.
        (_with(20, (STANDARD, 20)), _with(35, (INTERACTIVE, 35), waiting=9),
         load(1, waiting=9), L0, Reason.PREDICTED_SLO_MET),
    ],
)
def test_a_faster_backend_is_kept_for_a_tighter_class_that_only_it_serves(
    l0: BackendLoad, t0: BackendLoad, t1: BackendLoad, first: Backend, why: str
) -> None:
    order, reason = decide(snapshot(l0, t0, t1), STANDARD)
    assert (order[0], reason) == (first.url, why)


def test_a_backend_that_places_no_tighter_class_is_kept_for_none() -> None:
    # The decision skips gathering the classes where no tighter SLO on the candidates is one
    # its first choice places a stream of at all (gateway.routing.learned._least_placed): that
    # must be only where kept_for_tighter finds nothing to keep, whatever the curves, SLOs and
    # loads; and a class just looser than that SLO is placed.
    rng = random.Random(7)
    skipped = 0
    for _ in range(400):
        pred = _steps(rng.uniform(0.004, 0.03), rng.uniform(0.005, 0.06), rng.uniform(0.02, 0.3))
        loads = []
        for _ in range(rng.randint(1, 4)):
            slos = sorted({round(rng.uniform(0.003, 0.03), 4) for _ in range(rng.randint(0, 3))})
            counts = tuple((s, rng.randint(1, 30)) for s in slos)
            recent = tuple((s, rng.uniform(0.5, 20.0)) for s in slos[: rng.randint(0, 2)])
            loads.append(BackendLoad(running=sum(c for _, c in counts), slos=counts,
                                     recent=recent))  # fmt: skip
        request = rng.uniform(0.005, 0.04)
        tighter = TighterClasses([pred] * len(loads), loads, request)
        if not _any_between(loads, _least_placed(pred), request * TIGHTER):
            skipped += 1
            assert not kept_for_tighter(pred, loads[0], tighter)
        least = _least_placed(pred)
        assert most_streams(math.log(least * 1.001), pred) > 0
    assert 40 < skipped < 360  # both ways taken


def test_room_is_kept_for_a_class_that_comes_and_goes() -> None:
    # The tutorial's EAGLE (placed up to 14 streams at 12 ms, as below; a standard request
    # alone goes there up to 13). No interactive stream in flight now, but four on average
    # lately (on AWQ, where they missed): at 6 streams, 6 + 1 + 4 and a guard of 4 pass 14;
    # the standard request goes to AWQ.
    tut = Prediction(tpot=Curve.of(lambda n: max(0.0197, -0.0064 + 0.00192 * n) / 3.26),
                     ttft=Curve.of(lambda n: 0.1), observed_at=NOW, spread=SHARP)  # fmt: skip
    rare = load(0)._replace(recent=((INTERACTIVE.tpot_s, 4.0), (STANDARD.tpot_s, 3.0)))
    curves = {L0.url: tut, T0.url: awq(), T1.url: awq()}
    for n, first, why in ((6, T1, Reason.RESERVED), (5, L0, Reason.PREDICTED_SLO_MET)):
        s = LoadSnapshot((L0, T0, T1), {L0.url: _with(n, (STANDARD, n)), T0.url: rare,
                                        T1.url: load(0)}, NOW, curves)  # fmt: skip
        assert decide(s, STANDARD) == ([first.url, *decide(s, STANDARD)[0][1:]], why), n
        # ... and with the class forgotten, EAGLE fills to its own knee.
        s = replace(s, loads={**s.loads, T0.url: load(0)})
        assert decide(s, STANDARD)[0][0] == L0.url


def test_the_tighter_class_itself_takes_the_room() -> None:
    # The same crowded EAGLE: an interactive request still goes there (nothing else meets 12 ms).
    order, why = decide(snapshot(_with(20, (STANDARD, 20)), _with(35, (INTERACTIVE, 35)),
                                 load(0)), INTERACTIVE)  # fmt: skip
    assert (order[0], why) == (L0.url, Reason.PREDICTED_SLO_MET)


IN = INTERACTIVE.tpot_s


@pytest.mark.parametrize(
    ("eagle0", "eagle1", "pool", "kept"),
    [
        # 20 interactive streams on the pool, shared between two EAGLEs (10 each, 3 slots of
        # guard for 10 of 53): the one at 45 would hold 45 + 1 + 10 + 3, past 53; the one at
        # 30, 44.
        (_with(45), _with(30), _with(20, (INTERACTIVE, 20)), [True, False, False]),
        # A class no backend meets even alone (4 ms): nothing to keep room for.
        (_with(45), _with(30), _with(20, (Slo(tpot_s=0.004), 20)), [False, False, False]),
        # The interactive streams on the EAGLE at 47, more than its share of them (a guard of 5
        # for 20 of 53): 47 + 1 + 5 fit; the other needs room for its 10 still to come.
        (_with(47, (INTERACTIVE, 20)), _with(30), load(0), [False, False, False]),
        # ... at 48, not the request.
        (_with(48, (INTERACTIVE, 20)), _with(30), load(0), [True, False, False]),
    ],
)
def test_the_room_kept_is_shared_among_the_backends_that_serve_the_class(
    eagle0: BackendLoad, eagle1: BackendLoad, pool: BackendLoad, kept: list[bool]
) -> None:
    preds, loads = [eagle(), eagle(), awq()], [eagle0, eagle1, pool]
    tighter = TighterClasses(preds, loads, STANDARD.tpot_s)
    assert [kept_for_tighter(p, ld, tighter) for p, ld in zip(preds, loads, strict=True)] == kept


@pytest.mark.parametrize(
    ("streams", "limit", "slots"),
    [
        (10, 53, 3),  # 0.19 ** 3 < 1%
        (20, 53, 5),  # 0.38 ** 5 < 1%
        (1, 50, 2),  # one stream in flight: still one arriving while another is there
        (0.1, 100, 1),  # the least there is
        (52, 53, 53),  # 0.98: more than 200 slots, more than there are: all of them
        (60, 53, 53),
    ],
)
def test_the_guard_kept_for_a_class_still_to_come(streams: float, limit: int, slots: int) -> None:
    assert guard(streams, limit) == slots


@pytest.mark.parametrize(
    ("pred", "slo", "most"),
    [
        (eagle(), INTERACTIVE.tpot_s, 53),  # 11.98 ms at 53, 12.18 at 54
        (eagle(), 0.004, 0),  # not even alone (5.8 ms)
        (awq(), STANDARD.tpot_s, 220),  # 14 ms + 0.05 a stream: 25 ms at 220
        (Prediction(tpot=Curve.of(lambda n: 0.001), ttft=Curve.of(lambda n: 0.1)),
         STANDARD.tpot_s, 4096),  # never reaches it: the search's end
        # A step flat to 13.6 streams, then 1.92 ms a stream more (the tutorial's EAGLE):
        # output per second is highest at 14 (as the step itself has it), and 12 ms holds to
        # 23; a 15th stream adds less than it costs the others, so the class is placed there
        # up to 14.
        (Prediction(tpot=Curve.of(lambda n: max(0.0197, -0.0064 + 0.00192 * n) / 3.26),
                    ttft=Curve.of(lambda n: 0.1)), INTERACTIVE.tpot_s, 14),
    ],
)
def test_the_most_streams_within_an_slo(pred: Prediction, slo: float, most: int) -> None:
    assert most_streams(math.log(slo), pred) == most


# -- where nothing is known yet ----------------------------------------------------------------
def _cold(l0: BackendLoad, t0: BackendLoad, t1: BackendLoad,
          known: dict[str, Prediction] | None = None) -> LoadSnapshot:  # fmt: skip
    curves = dict.fromkeys((L0.url, T0.url, T1.url), UNKNOWN) | (known or {})
    return LoadSnapshot((L0, T0, T1), {L0.url: l0, T0.url: t0, T1.url: t1}, NOW, curves)


def test_a_cold_start_tries_the_latency_tier_first() -> None:
    for seed in range(20):
        order, why = decide(_cold(load(0), load(0), load(0)), INTERACTIVE, seed=seed)
        assert order[0] == L0.url
        assert why == Reason.FRONTIER


def test_one_stream_at_a_time_where_nothing_is_known() -> None:
    # The latency backend has a stream and nothing observed yet: the next goes elsewhere.
    order, why = decide(_cold(load(1), load(0), load(0)), INTERACTIVE)
    assert order[0] in (T0.url, T1.url)
    assert why == Reason.FRONTIER


def test_a_known_backend_that_meets_the_slo_keeps_a_lone_user_from_exploring() -> None:
    # EAGLE known and idle, the pool unknown: a first stream on EAGLE is as good as the best an
    # unknown backend could offer, and known: it goes first (a single user stays on EAGLE).
    s = _cold(load(0), load(0), load(0), {L0.url: eagle()})
    assert decide(s, INTERACTIVE) == ([L0.url, *decide(s, INTERACTIVE)[0][1:]],
                                      Reason.PREDICTED_SLO_MET)  # fmt: skip
    # With streams on EAGLE, one more adds less than a first stream would elsewhere: explore.
    order, why = decide(_cold(load(4), load(0), load(0), {L0.url: eagle()}), INTERACTIVE)
    assert order[0] in (T0.url, T1.url)
    assert why == Reason.FRONTIER


def test_the_first_stream_value_of_the_known_backends() -> None:
    pred = eagle()
    assert first_stream([UNKNOWN, pred, None], STANDARD) == pytest.approx(1 / pred.tpot.at(1))
    assert first_stream([UNKNOWN, None], STANDARD) == math.inf


def test_past_the_frontier_a_request_explores() -> None:
    seen8 = replace(eagle(), frontier=8)
    s = LoadSnapshot((L0, T0), {L0.url: load(8), T0.url: load(30)}, NOW,
                     {L0.url: seen8, T0.url: awq()})  # fmt: skip
    order, why = decide(s, STANDARD)
    assert order[0] == L0.url
    assert why == Reason.FRONTIER
    s = replace(s, loads={L0.url: load(7), T0.url: load(30)})
    assert decide(s, STANDARD) == ([L0.url, T0.url], Reason.PREDICTED_SLO_MET)


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


def unseen(stale: str) -> LoadSnapshot:
    """Every backend idle, one side unobserved for 30 s: the pool (`plain`) beside a fresh EAGLE
    engine, or (`speculative`) the EAGLE engine, after its drafts stopped being accepted, beside
    a fresh pool."""
    old = NOW - 30
    if stale == "plain":
        curves = {L0.url: replace(eagle(), acceptance=0.6), T0.url: replace(awq(), observed_at=old),
                  T1.url: replace(awq(), observed_at=old)}  # fmt: skip
    else:
        curves = {L0.url: replace(eagle(tps=1.0), acceptance=0.0, observed_at=old),
                  T0.url: awq(), T1.url: awq()}  # fmt: skip
    return LoadSnapshot((L0, T0, T1), {L0.url: load(0), T0.url: load(0), T1.url: load(0)}, NOW,
                        curves)  # fmt: skip


@pytest.mark.parametrize(
    ("stale", "keyed", "first", "why"),
    [
        # An idle pool not observed lately, the EAGLE engine fresh and chosen: a request with
        # no prefix to come back to explores the pool; a conversation's turn does not (plain
        # decoding's speed does not change unseen, and its later turns would pay to leave).
        ("plain", False, {T0.url, T1.url}, Reason.EXPLORE),
        ("plain", True, {L0.url}, Reason.PREDICTED_SLO_MET),
        # The EAGLE engine not observed lately, after its acceptance fell: its drafts may be
        # accepted again, and either request tries it.
        ("speculative", False, {L0.url}, Reason.EXPLORE),
        ("speculative", True, {L0.url}, Reason.EXPLORE),
    ],
)
def test_a_conversations_turn_explores_only_where_speed_can_change_unseen(
    stale: str, keyed: bool, first: set[str], why: str
) -> None:
    policy = build_policy("learned", PolicyParams(explore_rate=1.0, explore_after_s=10))
    s = unseen(stale)
    req = RouteRequest(MODEL, slo=STANDARD, affinity=7 if keyed else None)
    d = policy(req, s, RouterState(), random.Random(0))
    assert d.primary is not None
    assert d.primary.url in first
    assert d.reason == why


@pytest.mark.parametrize(
    ("stale", "explored_ago", "home", "first", "why"),
    [
        # No draw (a rate so small that the seed's draw misses it): an engine that decodes
        # speculatively, unobserved for explore_after_s, is tried by the next decision that may,
        # then not again for as long.
        ("speculative", None, None, {L0.url}, Reason.EXPLORE),
        ("speculative", 15.0, None, {L0.url}, Reason.EXPLORE),
        ("speculative", 5.0, None, {T0.url, T1.url}, Reason.PREDICTED_SLO_MET),
        # A request with a home goes home over an exploration: it is not the one to try.
        ("speculative", None, T0.url, {T0.url, T1.url}, Reason.PREDICTED_SLO_MET),
        # Plain decoding's speed does not change unseen: only the draw tries it.
        ("plain", None, None, {L0.url}, Reason.PREDICTED_SLO_MET),
    ],
)
def test_an_unseen_speculative_engine_is_tried_on_a_clock_whatever_the_draw(
    stale: str, explored_ago: float | None, home: str | None, first: set[str], why: str
) -> None:
    policy = build_policy("learned", PolicyParams(explore_rate=1e-9, explore_after_s=10))
    s = unseen(stale)
    state = RouterState()
    if explored_ago is not None:
        state = RouterState(explored=((L0.url, NOW - explored_ago),))
    d = policy(RouteRequest(MODEL, slo=STANDARD, home=home), s, state, random.Random(0))
    assert d.primary is not None
    assert d.primary.url in first
    assert d.reason == why
    if why == Reason.EXPLORE:
        assert dict(d.state.explored)[L0.url] == NOW
    else:
        assert d.state == state


def test_no_exploration_at_a_rate_of_0_not_even_on_the_clock() -> None:
    s = unseen("speculative")
    d = LEARNED(RouteRequest(MODEL, slo=STANDARD), s, RouterState(), random.Random(0))
    assert d.reason == Reason.PREDICTED_SLO_MET


def test_what_was_tried_long_ago_is_forgotten_when_another_backend_is_tried() -> None:
    policy = build_policy("learned", PolicyParams(explore_rate=1e-9, explore_after_s=10))
    s = unseen("speculative")
    state = RouterState(explored=(("http://gone:8000", NOW - 11), ("http://recent:8000", NOW - 2)))
    d = policy(RouteRequest(MODEL, slo=STANDARD), s, state, random.Random(0))
    assert d.reason == Reason.EXPLORE
    assert d.state.explored == (("http://recent:8000", NOW - 2), (L0.url, NOW))


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
    ("t0", "t1", "first"),
    [
        # flat curves: one more stream slows no one, so the faster engine adds most, loaded or not
        ((0.0140, 0.0), (0.0144, 0.0), T0),
        # the same engine, rising 1% a stream: the less loaded adds most (its streams lose least)
        ((0.0140, 0.00014), (0.0140, 0.00014), T1),
    ],
)
def test_alike_backends(t0: tuple[float, float], t1: tuple[float, float], first: object) -> None:
    c0 = Prediction(tpot=Curve.of(lambda n: t0[0] + t0[1] * n), ttft=Curve.of(lambda n: 0.1))
    c1 = Prediction(tpot=Curve.of(lambda n: t1[0] + t1[1] * n), ttft=Curve.of(lambda n: 0.1))
    s = LoadSnapshot((T0, T1), {T0.url: load(5), T1.url: load(1)}, NOW,
                     {T0.url: c0, T1.url: c1})  # fmt: skip
    assert decide(s)[0][0] == first.url  # type: ignore[attr-defined]


def _seen_to(frontier: int, at: float = 0.0035, spread: float = 0.04) -> Prediction:
    """A plain engine seen flat at `at` up to `frontier` streams, and past it the model's own
    ridge prior (gateway.backends.latency_model.beyond): the doubt grows with the distance."""
    table, doubt = beyond([at] * (TABLE_MAX + 1), frontier, float(frontier), 2048.0)
    return Prediction(tpot=Curve.tabled(table), ttft=Curve.of(lambda n: 0.1), observed_at=NOW,
                      frontier=frontier, spread=spread, doubt=tuple(doubt))  # fmt: skip


FOUR_MS = Slo(ttft_s=1.0, tpot_s=0.004)


@pytest.mark.parametrize("n", [0, 3, 4, 5, 8, 12, 30, 200])
@pytest.mark.parametrize("pred", [_seen_to(3), _seen_to(16), awq()])
def test_the_envelope_is_the_best_average_gain_over_the_next_streams(
    n: int, pred: Prediction
) -> None:
    def output(m: int) -> float:  # every stream of the request's class (none of known SLO)
        return m * met(FOUR_MS.log_tpot, m, pred) / pred.tpot.at(m) if m else 0.0

    o = outlook(T0, load(inflight=n), pred, FOUR_MS, LEARNED.limits)
    assert o.gain == pytest.approx(output(n + 1) - output(n), rel=1e-9, abs=1e-9)
    expected = max([o.gain] + [(output(n + k) - output(n)) / k for k in REACH
                               if n + k <= TABLE_MAX])  # fmt: skip
    assert envelope(pred, load(inflight=n), n, FOUR_MS, o.gain) == pytest.approx(expected)


def test_an_engine_seen_far_has_no_dip_to_look_past() -> None:
    # Within its data a curve that only rises gives each stream less than the one before:
    # the envelope there is the next stream's gain.
    pred = awq()
    for n in (1, 5, 20):
        o = outlook(T0, load(inflight=n), pred, STANDARD, LEARNED.limits)
        assert envelope(pred, load(inflight=n), n, STANDARD, o.gain) == pytest.approx(o.gain)


def test_past_their_frontiers_a_burst_is_shared_among_a_tiers_replicas() -> None:
    # Two like pool engines seen to 3 streams, a 4 ms class that each meets to about 20: by
    # the next stream's gain alone the burst piled onto whichever had passed its dip.
    pred = _seen_to(3)
    inflight = {T0.url: 3, T1.url: 3}
    for _ in range(40):
        s = LoadSnapshot((T0, T1), {u: load(inflight=k) for u, k in inflight.items()}, NOW,
                         {T0.url: pred, T1.url: pred})  # fmt: skip
        order, why = decide(s, FOUR_MS)
        assert why == Reason.FRONTIER
        inflight[order[0]] += 1
    assert abs(inflight[T0.url] - inflight[T1.url]) <= 2, inflight


def test_across_tiers_the_next_streams_gain_still_decides() -> None:
    # A latency engine in its dip past its frontier (6 streams), a pool engine past its own
    # (20): unlike engines, so the one whose next stream adds most goes first, as before.
    pred = _seen_to(3)
    loads = (load(inflight=6), load(inflight=20))
    gains = [outlook(T0, ld, pred, FOUR_MS, LEARNED.limits).gain for ld in loads]
    assert gains[1] > gains[0]  # the pool engine's next stream adds more ...
    assert envelope(pred, loads[0], 6, FOUR_MS, gains[0]) > envelope(pred, loads[1], 20,
                                                                     FOUR_MS, gains[1])
    s = LoadSnapshot((L0, T0), {L0.url: loads[0], T0.url: loads[1]}, NOW,
                     {L0.url: pred, T0.url: pred})  # fmt: skip
    assert decide(s, FOUR_MS)[0][0] == T0.url
    # ... and as replicas of one tier, the one in its dip goes first (more over the next few).
    s = LoadSnapshot((T1, T0), {T1.url: loads[0], T0.url: loads[1]}, NOW,
                     {T1.url: pred, T0.url: pred})  # fmt: skip
    assert decide(s, FOUR_MS)[0][0] == T1.url


def test_where_nothing_is_to_be_gained_load_decides() -> None:
    # Neither backend can meet 1 ms, and neither has streams to lose: the less loaded first,
    # not whichever rounding favours.
    flat = Prediction(tpot=Curve.of(lambda n: 0.014), ttft=Curve.of(lambda n: 0.1), spread=SHARP)
    tight = Slo(ttft_s=1.0, tpot_s=0.001)
    for loads in ((load(5), load(1)), (load(1), load(5))):
        s = LoadSnapshot((T0, T1), {T0.url: loads[0], T1.url: loads[1]}, NOW,
                         {T0.url: flat, T1.url: flat})  # fmt: skip
        order, why = decide(s, tight)
        assert order[0] == (T1.url if loads[0].running > loads[1].running else T0.url)
        assert why == Reason.HEADROOM


def test_a_large_tier_is_evaluated_by_a_shortlist() -> None:
    pool = [Backend(f"http://awq-{i}:8000", "awq", Role.THROUGHPUT, frozenset({MODEL}))
            for i in range(14)]  # fmt: skip
    loads = {b.url: load(i) for i, b in enumerate(pool)}
    s = LoadSnapshot((L0, *pool), {L0.url: load(0), **loads}, NOW, {})
    small = [L0, *pool[:SHORTLIST]]
    assert shortlist(small, random.Random(0)) == (small, [])  # no tier past the shortlist
    keep, rest = shortlist([L0, *pool], random.Random(0))
    assert L0 in keep  # a tier within the shortlist is evaluated whole
    assert len(keep) == 1 + SHORTLIST
    assert sorted(keep + rest, key=lambda b: b.url) == sorted([L0, *pool], key=lambda b: b.url)
    assert shortlist([L0, *pool], random.Random(0)) == (keep, rest)  # a seed replays it
    drawn = {b.url for seed in range(30) for b in shortlist(pool, random.Random(seed))[0]}
    assert drawn == {b.url for b in pool}  # every backend has its chance
    # ... and the same chance: a uniform sample (each in SHORTLIST of 14 draws), the pool as it was
    given = list(pool)
    counts = Counter(b.url for seed in range(3000) for b in shortlist(pool, random.Random(seed))[0])
    assert pool == given
    expected = 3000 * SHORTLIST / len(pool)
    assert all(abs(c - expected) < 0.1 * expected for c in counts.values()), counts
    d = LEARNED(RouteRequest(MODEL, slo=STANDARD), s, RouterState(), random.Random(0))
    assert sorted(b.url for b in d.candidates) == sorted(b.url for b in [L0, *pool])


def test_a_remembered_outlook_is_the_one_computed_afresh() -> None:
    """A prediction remembers outlooks by what they depend on (the streams there and their
    SLOs, the request's SLO, the policy's limits): over loads, SLOs and policies, each asked in
    turn of the same prediction, the outlook read is the one from a copy that remembers none."""
    rng = random.Random(7)
    # TTFT rising through every SLO's margin and "full" threshold below
    shared = replace(eagle(spread=0.1), ttft=Curve.of(lambda n: 0.03 * n))
    settings = ((0.1, 3.0, 8), (0.3, 3.0, 8), (0.1, 1.5, 8), (0.1, 3.0, 0))
    policies = [Learned.build("learned", PolicyParams(slo_margin=m, full_ttft_factor=f,
                                                      max_waiting=w))
                for m, f, w in settings]  # fmt: skip
    slos = [INTERACTIVE, STANDARD, Slo(ttft_s=0.2, tpot_s=0.012), Slo(ttft_s=1.0, tpot_s=0.05)]
    asked = 0
    for n in range(40):
        tight = rng.randrange(0, n + 1)
        classes = tuple((s, c) for s, c in ((0.012, tight), (0.025, n - tight)) if c)
        lb = BackendLoad(running=rng.randrange(0, 45), waiting=rng.choice((0, 3, 12)),
                         inflight=n, stale=rng.random() < 0.2, slos=classes,
                         inflight_at_scrape=rng.choice((None, n)))  # fmt: skip
        for slo in slos:  # the same load, each SLO and policy in turn
            for limits in (p.limits for p in policies):
                got = outlook(L0, lb, shared, slo, limits)
                assert got == outlook(L0, lb, replace(shared), slo, limits), (lb, slo, limits)
                asked += 1
    assert 0 < len(shared.outlooks) < asked  # some were read back


@pytest.mark.parametrize(
    ("asked", "frontier", "told"),
    [
        (0, 32, 0),  # nothing asked of the old one: nothing to tell
        (5, 32, 5),
        (RETOLD + 20, 32, RETOLD),  # the most recent only
        (5, 0, 0),  # a prediction of nothing observed is never asked by its memory
    ],
)
def test_a_new_prediction_is_told_the_outlooks_asked_last(
    asked: int, frontier: int, told: int
) -> None:
    old = eagle(spread=0.1)
    limits = Learned.build("learned", PolicyParams()).limits
    loads = [BackendLoad(running=n, inflight=n, slos=((0.012, n // 3), (0.025, n - n // 3)))
             for n in range(asked)]  # fmt: skip
    for lb in loads:
        outlook(L0, lb, old, STANDARD, limits)
    fresh = replace(eagle(spread=0.2), frontier=frontier)  # learned since: another curve
    remember_outlooks(fresh, old)
    assert len(fresh.outlooks) == told
    assert list(fresh.outlooks) == list(old.outlooks)[len(old.outlooks) - told :]
    for key, found in fresh.outlooks.items():
        n, slos = key[0], key[1]
        again = outlook(L0, BackendLoad(running=n, inflight=n, slos=slos), replace(fresh),
                        STANDARD, limits)  # fmt: skip
        assert found == again  # computed from the fresh prediction, to the bit
    if told:  # ... not copied from the old one, whose curve differs
        assert any(found != old.outlooks[key] for key, found in fresh.outlooks.items())


@pytest.mark.parametrize("seed", range(60))
def test_candidates_are_the_filters_and_the_shortlist_in_one_pass(seed: int) -> None:
    rng = random.Random(seed)
    sizes = {"eagle": (Role.LATENCY, rng.randint(1, 3)),
             "awq": (Role.THROUGHPUT, rng.randint(1, 12)),
             "bf16": (Role.THROUGHPUT, rng.randint(0, 7))}  # fmt: skip
    listed = [Backend(f"http://{tier}-{i}:8000", tier, role,
                      frozenset({MODEL} if rng.random() < 0.9 else {"other"}))
              for tier, (role, size) in sizes.items() for i in range(size)]  # fmt: skip
    loads = {b.url: BackendLoad(healthy=rng.random() < 0.85) for b in listed}
    exclude = frozenset(b.url for b in listed if rng.random() < 0.1)
    req = RouteRequest(MODEL, pinned=rng.choice((None, Role.LATENCY, Role.THROUGHPUT)),
                       exclude=exclude)  # fmt: skip
    snap = LoadSnapshot(tuple(listed), loads, distinct=True)
    stages = shortlist(pinned(req, eligible(req, snap)), random.Random(seed))
    assert candidates(req, snap, random.Random(seed)) == stages  # each tier listed together
    # Tiers listed interleaved: the same backends evaluated and failed over to, per tier.
    mixed = LoadSnapshot(tuple(sorted(listed, key=lambda b: b.url[-6:])), loads, distinct=True)
    keep, rest = candidates(req, mixed, random.Random(seed))
    assert sorted(b.url for b in keep + rest) == sorted(b.url for b in stages[0] + stages[1])
    for tier in sizes:
        assert sum(b.tier == tier for b in keep) == sum(b.tier == tier for b in stages[0])
    # A snapshot that may list a URL twice goes through the stages one by one.
    twice = LoadSnapshot((*listed, *listed[:1]), loads)
    assert candidates(req, twice, random.Random(seed)) == shortlist(
        pinned(req, eligible(req, twice)), random.Random(seed)
    )


# Overload (`_drain`): a 4 ms class on H200-like engines. An AWQ engine: 3.43 ms a token and
# 0.024 ms more a stream (meets 4 ms to 23 streams); an EAGLE engine accepting little: 3.55 ms
# and 0.1 ms more a stream (to 4 streams).
def _rising(base: float, per_stream: float, frontier: int = TABLE_MAX) -> Prediction:
    return Prediction(tpot=Curve.of(lambda n: base + per_stream * n),
                      ttft=Curve.of(lambda n: 0.05), observed_at=NOW, frontier=frontier,
                      spread=SHARP)  # fmt: skip


AWQ_H200 = _rising(0.00343, 0.000024)
EAGLE_LITTLE = _rising(0.00355, 0.0001)


@pytest.mark.parametrize(
    ("streams", "first", "why"),
    [
        # A burst piled 48 streams onto one AWQ engine (each misses 4 ms, so one more loses
        # nothing there); the other is at its edge, the EAGLE engine at its own. Draining the
        # pile wins back 23 streams that meet the SLO; the EAGLE engine gives up 4 as the sink.
        ((4, 48, 23), L0, Reason.DRAIN),
        # No pile: one more loses least on the EAGLE engine anyway (4 streams against 23).
        ((4, 23, 23), L0, Reason.HEADROOM),
        # The pile is the EAGLE engine, the backend with the least to give: it stays the sink.
        ((40, 23, 23), L0, Reason.HEADROOM),
        # Room somewhere (the other AWQ engine at 10 streams): no overload, the pile waits.
        ((4, 48, 10), T1, Reason.PREDICTED_SLO_MET),
    ],
)
def test_under_overload_a_pile_drains_onto_the_backend_with_least_to_give(
    streams: tuple[int, int, int], first: Backend, why: str
) -> None:
    l0, t0, t1 = (BackendLoad(running=n, slos=((FOUR_MS.tpot_s, n),)) for n in streams)
    s = LoadSnapshot((L0, T0, T1), {L0.url: l0, T0.url: t0, T1.url: t1}, NOW,
                     {L0.url: EAGLE_LITTLE, T0.url: AWQ_H200, T1.url: AWQ_H200})  # fmt: skip
    order, reason = decide(s, FOUR_MS)
    assert (order[0], reason) == (first.url, why)


def test_a_pile_drains_only_onto_a_backend_whose_peak_is_known() -> None:
    pile = BackendLoad(running=48, slos=((FOUR_MS.tpot_s, 48),))
    # Nothing known of the other engine (a stream there already): no peak to weigh.
    s = LoadSnapshot((T0, T1), {T0.url: pile, T1.url: load(1)}, NOW, {T0.url: AWQ_H200})
    assert decide(s, FOUR_MS) == ([T0.url, T1.url], Reason.HEADROOM)
    # The EAGLE engine at its edge (4 streams) but seen to 3: its output still rising at the
    # 4th, where the model last looks, so its peak may lie further out ...
    past = BackendLoad(running=4, slos=((FOUR_MS.tpot_s, 4),))
    for frontier, first, why in ((3, T0, Reason.HEADROOM), (4, L0, Reason.DRAIN)):
        curves = {L0.url: replace(EAGLE_LITTLE, frontier=frontier), T0.url: AWQ_H200}
        s = LoadSnapshot((L0, T0), {L0.url: past, T0.url: pile}, NOW, curves)
        # ... seen to 4, known: it gives up 4 streams, the pile wins back 23.
        order, reason = decide(s, FOUR_MS)
        assert (order[0], reason) == (first.url, why)


@pytest.mark.parametrize(
    ("pred", "slo", "most", "at"),
    [
        # Up to one stream past its frontier (8): 9 streams of 10 ms, each within 25 ms.
        (_rising(0.010, 0.0, frontier=8), 0.025, 9 / 0.010, 9),
        # Seen everywhere: the most streams within 4 ms, 23, at 3.982 ms.
        (AWQ_H200, 0.004, 23 / (0.00343 + 23 * 0.000024), 23),
        (EAGLE_LITTLE, 0.004, 4 / 0.00395, 4),
        (AWQ_H200, 0.003, 0.0, 0),  # out of reach at any load
    ],
)
def test_a_backends_peak_output_for_a_class(
    pred: Prediction, slo: float, most: float, at: int
) -> None:
    found = peak(Slo(tpot_s=slo).log_tpot, pred)
    assert found == (pytest.approx(most, rel=1e-5), at)
    assert output(Slo(tpot_s=slo).log_tpot, at, pred) == pytest.approx(most, rel=1e-5)


def test_a_new_prediction_is_told_the_peaks_of_the_classes_in_flight() -> None:
    fresh = _rising(0.00343, 0.000024)
    remember_peaks(fresh, [0.004, 0.025, 0.004])
    assert set(fresh.peaks) == {Slo(tpot_s=0.004).log_tpot, Slo(tpot_s=0.025).log_tpot}
    # ... as a decision reads them (the same ln, to the bit)
    again = peak(math.log(0.004), _rising(0.00343, 0.000024))
    assert fresh.peaks[Slo(tpot_s=0.004).log_tpot] == again
