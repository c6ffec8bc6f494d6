"""Prefix-cache affinity (gateway.routing.affinity), by tables of cases: a key served lately goes
back to its home in either tier while the home is within the load bound, not saturated, and not
predicted to miss the SLO (or be past its knee) where the policy's choice would not be; a
declared session seen for the first time goes to its keyed backend of the policy's tier; a
prompt seen for the first time, unkeyed requests and decisions with a reason of their own keep
the policy's order; the key comes from the session, the user, the conversation's opening or the
prompt's beginning."""

from __future__ import annotations

import collections
import json
import math
import random
from dataclasses import replace

import pytest

from gateway.pipeline.intake import _LATER_BODY, affinity_of, later_turn
from gateway.routing import Decision, PolicyParams, Reason, RouteRequest, RouterState
from gateway.routing.affinity import Affinity, affinity_key, rank
from gateway.routing.curves import Curve, Prediction
from gateway.routing.types import Backend, BackendLoad, LoadSnapshot, Slo, Stay
from tests.unit.routingfixtures import L0, MODEL, T0, T1, T2, T3, load, snap, urls

AFF = Affinity.of(PolicyParams())
POOL = (T0, T1, T2, T3)
KEY = affinity_key(b"conversation-1")
# KEY's own order of the pool: its first choice, then its second...
FIRST, SECOND, *_ = rank(KEY, POOL)
SESSION = RouteRequest(MODEL, affinity=KEY, session=True)


def decide(order: tuple[object, ...], reason: str = Reason.LEAST_LOADED) -> Decision:
    return Decision(order, reason, "least-loaded", RouterState())  # type: ignore[arg-type]


def snapshot(inflight: dict[object, int]) -> object:
    return snap(*((b, load(inflight=inflight.get(b, 0))) for b in (L0, *POOL)))


# -- a key served lately: back to its home, in either tier ------------------------------------

# TPOT by streams: the latency backend fast until a knee at 8 streams, the pool slower and flat.
FAST = Prediction(Curve.of(lambda n: 0.010 if n <= 8 else 0.010 * (n / 8) ** 2),
                  Curve.of(lambda n: 0.05), frontier=64)  # fmt: skip
SLOW = Prediction(Curve.of(lambda n: 0.020 + 0.0001 * n), Curve.of(lambda n: 0.1), frontier=64)
SLO = Slo(ttft_s=1.0, tpot_s=0.025)


def learned_snapshot(inflight: dict[Backend, int]) -> LoadSnapshot:
    s = snap(*((b, load(inflight=inflight.get(b, 0))) for b in (L0, *POOL)))
    return replace(s, curves={L0.url: FAST, **{b.url: SLOW for b in POOL}})


# What the model knows: every backend ("all"), none, or only the home; "/4": the home observed
# up to 4 streams only (the curve past that is its guess).
ALL, NONE, HOME, ALL_4, HOME_4 = "all", "none", "home", "all/4", "home/4"


@pytest.mark.parametrize(
    ("case", "home", "policy_first", "inflight", "known", "stay"),
    [
        ("idle pool: home over the policy's choice", T2, T0, {}, ALL, Stay.HOME),
        ("home in the other tier, before its knee", L0, T0, {L0: 4}, ALL, Stay.HOME),
        ("home already first", T0, T0, {}, ALL, Stay.HOME),
        ("policy tries an unknown backend, home meets its SLO", L0, T0, {L0: 4}, HOME, Stay.HOME),
        ("policy tries an unknown backend, home past its knee", L0, T0, {L0: 14}, HOME,
         Stay.UNKNOWN),
        # 9 streams at the home, a tenth there: within the SLO (15.6 ms) but past FAST's knee
        # (641 tokens/s for 10 streams against 711 for 9).
        ("policy tries an unknown backend, home past a knee seen", L0, T0, {L0: 9}, HOME,
         Stay.UNKNOWN),
        ("policy tries an unknown backend, knee past the frontier", L0, T0, {L0: 9}, HOME_4,
         Stay.HOME),
        # 14 streams: the home's guess past its frontier misses the SLO, as above, where the
        # choice is known to meet it; here the choice is a guess too, and the cache is home.
        ("policy tries an unknown backend, home's miss a guess", L0, T0, {L0: 14}, HOME_4,
         Stay.HOME),
        ("home past an observed knee, the choice gains", L0, T0, {L0: 9}, ALL, Stay.GIVE_WAY),
        ("home past a knee beyond its frontier, the choice gains", L0, T0, {L0: 9}, ALL_4,
         Stay.HOME),
        # The latency backend idle, twice as fast as the home (10 ms against 20.1): more than
        # twice the SLO-meeting output there (`affinity_yield`, 2).
        ("home in the pool, the latency tier idle and 2x faster", T1, L0, {}, ALL, Stay.GIVE_WAY),
        # ... with 8 streams there, a ninth past its knee: it adds less than the home would.
        ("home in the pool, the latency tier at its knee", T1, L0, {L0: 8}, ALL, Stay.HOME),
        # The latency backend at 14 streams: TPOT 0.031 s, past the 25 ms SLO; the pool meets it.
        ("home past its knee for the SLO: the policy's choice", L0, T0, {L0: 14}, ALL, Stay.MISS),
        ("home beyond its frontier, predicted to miss the SLO", L0, T0, {L0: 14}, ALL_4, Stay.MISS),
        # 13 on the pool's home, 0 elsewhere: SLOW's TPOT still meets the SLO there, and one
        # conversation holds one request at a time: the model, not the bound, decides.
        ("known home beyond the bound, within its SLO: home", T2, T0, {T2: 13}, ALL, Stay.HOME),
        # Nothing known of the home: the cache hit is all that is known (saturation aside).
        ("unknown home beyond the bound", T2, T0, {T2: 6}, NONE, Stay.HOME),
        ("unknown latency home", L0, T0, {L0: 14}, NONE, Stay.HOME),
    ],
)
def test_a_key_served_lately_goes_home(
    case: str, home: Backend, policy_first: Backend, inflight: dict[Backend, int], known: str,
    stay: Stay,
) -> None:  # fmt: skip
    order = (policy_first, *(b for b in (L0, *POOL) if b is not policy_first))
    req = RouteRequest(MODEL, slo=SLO, affinity=KEY, home=home.url)
    s = learned_snapshot(inflight)
    curves = dict(s.curves)
    if known.endswith("/4"):
        curves[home.url] = replace(curves[home.url], frontier=4)
    if known.startswith(HOME):
        curves = {home.url: curves[home.url]}
    elif known == NONE:
        curves = {}
    d = AFF(req, decide(order), replace(s, curves=curves))
    assert d.candidates[0] is (home if stay == Stay.HOME else policy_first), case
    assert d.affinity == stay, case  # which check decided
    assert sorted(urls(d)) == sorted(b.url for b in order)  # nothing lost, nothing added


@pytest.mark.parametrize(
    ("case", "give_way", "home_streams", "goes_home"),
    [
        ("never for speed alone", 0.0, 0, True),
        ("the choice adds 2.01x the home's output", 2.0, 0, False),
        ("... short of 3x", 3.0, 0, True),
        ("... over 1x", 1.0, 0, False),
        # Past the streams the home has shown its gain is a guess: its next stream is tried.
        ("the home past its frontier", 2.0, 6, True),
    ],
)
def test_a_home_gives_way_to_a_choice_that_adds_several_times_its_output(
    case: str, give_way: float, home_streams: int, goes_home: bool
) -> None:
    """A conversation on a pool instance (SLOW, 20.1 ms) beside an idle latency backend (FAST,
    10 ms): both meet the SLO; the latency backend adds twice the SLO-meeting tokens per second
    the home would."""
    aff = Affinity.of(PolicyParams(affinity_yield=give_way))
    s = learned_snapshot({T1: home_streams})
    if home_streams:  # observed up to 4 streams only: 7 is a guess there
        s = replace(s, curves={**s.curves, T1.url: replace(SLOW, frontier=4)})
    req = RouteRequest(MODEL, slo=SLO, affinity=KEY, home=T1.url)
    d = aff(req, decide((L0, T0, T1, T2, T3)), s)
    assert d.candidates[0] is (T1 if goes_home else L0), case


@pytest.mark.parametrize(
    ("case", "streams", "goes_home"),
    [
        ("before the knee", 4, True),
        # 9 streams there: the curve at 10 is 15.6 ms, past the 12 ms SLO; one more stream
        # takes SLO-meeting output from the nine.
        ("past its knee", 9, False),
    ],
)
def test_a_home_past_its_knee_gives_way_to_a_choice_that_costs_nothing(
    case: str, streams: int, goes_home: bool
) -> None:
    """A 12 ms class: the pool (20 ms) never meets it, so the request adds nothing there, but
    it takes nothing from anyone either."""
    slo = Slo(ttft_s=1.0, tpot_s=0.012)
    req = RouteRequest(MODEL, slo=slo, affinity=KEY, home=L0.url)
    d = AFF(req, decide((T0, L0, T1, T2, T3)), learned_snapshot({L0: streams}))
    assert d.candidates[0] is (L0 if goes_home else T0), case


# Seconds a prompt token adds to a prefill, as an engine's prefill times teach it.
PER_TOKEN = 1e-4


@pytest.mark.parametrize(
    ("case", "prompt", "answer", "learned", "goes_home"),
    [
        # The latency backend idle, 10 ms against the home's 20.1: 23 tokens save 0.23 s,
        # the history's prefill there costs 0.4.
        ("a short answer: the prefill outweighs", 4000, 24, "both", True),
        ("a long answer: decoding saves more", 4000, 256, "both", False),
        ("a short history", 1000, 24, "both", False),
        # The choice has no prefill time of its own: priced with the home's.
        ("the choice's cost unknown: the home's", 4000, 24, "home", True),
        # Unpriced: the move is weighed by decoding alone, as without the prefill.
        ("no prefill time learned", 4000, 24, "none", False),
        ("the answer's limit not given", 4000, 0, "both", False),
        ("the prompt's size not known", 0, 24, "both", False),
    ],
)
def test_a_give_way_is_priced_with_the_historys_prefill(
    case: str, prompt: int, answer: int, learned: str, goes_home: bool
) -> None:
    """As the give-way above (a pool home beside an idle latency backend twice as fast), the
    move now weighed against the history's prefill where it lands."""
    aff = Affinity.of(PolicyParams(affinity_yield=2.0))
    home_cost = PER_TOKEN if learned != "none" else 0.0
    choice_cost = PER_TOKEN if learned == "both" else 0.0
    pool = {b.url: replace(SLOW, prefill_s=home_cost) for b in POOL}
    s = replace(learned_snapshot({}), curves={L0.url: replace(FAST, prefill_s=choice_cost), **pool})
    req = RouteRequest(MODEL, slo=SLO, affinity=KEY, home=T1.url, prompt_tokens=prompt,
                       max_tokens=answer)  # fmt: skip
    d = aff(req, decide((L0, T0, T1, T2, T3)), s)
    assert d.candidates[0] is (T1 if goes_home else L0), case
    assert d.affinity == (Stay.HOME if goes_home else Stay.GIVE_WAY), case


@pytest.mark.parametrize(
    ("case", "prompt", "answer", "give_way", "goes_home"),
    [
        # The home at 9 streams, a tenth past its knee: it loses 70 tokens/s over the
        # request's 24 x 15.6 ms (26 tokens); the history's prefill stalls the idle pool
        # backend's one stream (the request's own) 1 s: 50 tokens at its 20.1 ms. (The
        # give-way off: the past-knee rule alone.)
        ("a long history, a short answer: home", 10000, 24, 0.0, True),
        ("a short history: the choice", 1000, 24, 0.0, False),
        ("a long answer: the choice", 10000, 256, 0.0, False),
        ("unpriced: the choice", 10000, 0, 0.0, False),
        # The choice adds twice the home's output (its whole rate against a loss): the
        # give-way moves it, unpriced where the home is past its knee.
        ("the give-way, past the knee: unpriced", 10000, 24, 2.0, False),
    ],
)
def test_a_move_past_the_knee_is_priced_with_the_historys_prefill(
    case: str, prompt: int, answer: int, give_way: float, goes_home: bool
) -> None:
    aff = Affinity.of(PolicyParams(affinity_yield=give_way))
    s = learned_snapshot({L0: 9})
    s = replace(s, curves={k: replace(v, prefill_s=PER_TOKEN) for k, v in s.curves.items()})
    req = RouteRequest(MODEL, slo=SLO, affinity=KEY, home=L0.url, prompt_tokens=prompt,
                       max_tokens=answer)  # fmt: skip
    d = aff(req, decide((T0, L0, T1, T2, T3)), s)
    assert d.candidates[0] is (L0 if goes_home else T0), case
    moved = Stay.GIVE_WAY if give_way else Stay.PAST_KNEE
    assert d.affinity == (Stay.HOME if goes_home else moved), case


@pytest.mark.parametrize(
    ("case", "prompt", "answer", "stay"),
    [
        # The home at 9 streams, a tenth past its knee within the SLO (15.6 ms): it loses 70
        # tokens/s over the request's 24 x 15.6 ms (26 tokens). Nothing is known of the
        # choice: its TPOT taken as the home's for one stream (10 ms), the history's prefill
        # there (1 s at the home's cost, the choice idle) stalls 100 tokens.
        ("a long history, a short answer: home", 10000, 24, Stay.HOME),
        ("a short history: the unknown choice", 1000, 24, Stay.UNKNOWN),
        ("a long answer: the unknown choice", 10000, 256, Stay.UNKNOWN),
        ("unpriced: the unknown choice", 10000, 0, Stay.UNKNOWN),
    ],
)
def test_a_move_past_the_knee_to_an_unknown_choice_is_priced_too(
    case: str, prompt: int, answer: int, stay: Stay
) -> None:
    s = learned_snapshot({L0: 9})
    known = {k: replace(v, prefill_s=PER_TOKEN) for k, v in s.curves.items() if k != T0.url}
    req = RouteRequest(MODEL, slo=SLO, affinity=KEY, home=L0.url, prompt_tokens=prompt,
                       max_tokens=answer)  # fmt: skip
    d = AFF(req, decide((T0, L0, T1, T2, T3)), replace(s, curves=known))
    assert d.candidates[0] is (L0 if stay == Stay.HOME else T0), case
    assert d.affinity == stay, case


@pytest.mark.parametrize(
    ("case", "req", "stay"),
    [
        # (affinity not asked: "")
        ("a prompt seen for the first time", RouteRequest(MODEL, affinity=KEY), ""),
        ("a home that left the pool", RouteRequest(MODEL, affinity=KEY, home="http://gone:1"),
         Stay.GONE),
        ("no key at all", RouteRequest(MODEL, home=T2.url), ""),
    ],
)
def test_the_policy_order_stands(case: str, req: RouteRequest, stay: str) -> None:
    d = decide((T3, T2, T1, T0, L0))
    assert AFF(req, d, snapshot({})) == d._replace(affinity=stay), case


@pytest.mark.parametrize(
    ("case", "home_load", "chosen_load", "goes_home"),
    [
        ("a queue at the home, the choice idle: the choice", load(8, 2), load(), False),
        ("the same, the choice's count ours only", load(8, 2), load(inflight=0), False),
        ("a queue at the home, the choice busy: home", load(8, 2), load(inflight=1), True),
        ("a queue at the home, the choice queued too: home", load(8, 2), load(8, 1), True),
        ("a full batch without a queue: home", load(8, 0), load(), True),
        ("a queue seen in a stale scrape: home", load(8, 2, stale=True), load(), True),
    ],
)
def test_a_home_with_a_queue_gives_way_to_an_idle_choice(
    case: str, home_load: BackendLoad, chosen_load: BackendLoad, goes_home: bool
) -> None:
    """Where nothing else moves the request (the model knows neither backend, the home is not
    saturated), a queue at the home still does when the policy's choice is idle."""
    loads = {b: load() for b in (L0, *POOL)} | {T2: home_load, T0: chosen_load}
    s = snap(*((b, loads[b]) for b in (L0, *POOL)))
    d = AFF(RouteRequest(MODEL, affinity=KEY, home=T2.url), decide((T0, T1, T2, T3, L0)), s)
    assert d.candidates[0] is (T2 if goes_home else T0), case
    assert d.affinity == (Stay.HOME if goes_home else Stay.QUEUE), case


def test_a_saturated_home_is_left() -> None:
    """max_waiting 8: a fresh queue of 9 saturates the home, known to the model or not."""
    loaded = {b: load() for b in POOL} | {T2: load(running=0, waiting=9)}
    s = snap((L0, load()), *((b, loaded[b]) for b in POOL))
    d = decide((T0, T1, T2, T3, L0))
    got = AFF(RouteRequest(MODEL, affinity=KEY, home=T2.url), d, s)
    assert got == d._replace(affinity=Stay.SATURATED)


# A flat 5 ms TPOT up to 64 streams: every load meets the SLO and gains.
FLAT = Prediction(Curve.of(lambda n: 0.005), Curve.of(lambda n: 0.05), frontier=64)


@pytest.mark.parametrize(
    ("case", "policy", "home", "home_load", "known", "goes_home"),
    [
        ("learned: a latency home past the fixed cap, within its SLO", "learned", L0,
         load(inflight=25), True, True),
        ("a fixed policy: the latency cap holds", "least-loaded", L0, load(inflight=25), True,
         False),
        ("learned, a home the model does not know: the cap holds", "learned", L0,
         load(inflight=25), False, False),
        ("learned: a pool home with a fresh queue is full by the model too", "learned", T2,
         load(running=4, waiting=9), True, False),
    ],
)  # fmt: skip
def test_a_home_has_room_by_the_policys_own_measure(
    case: str, policy: str, home: Backend, home_load: BackendLoad, known: bool, goes_home: bool
) -> None:
    loads = {b: load() for b in (L0, *POOL)} | {home: home_load}
    s = snap(*((b, loads[b]) for b in (L0, *POOL)))
    curves = {b.url: FLAT for b in (L0, *POOL) if known or b is not home}
    order = (T0, *(b for b in (L0, *POOL) if b is not T0))
    d = Decision(order, Reason.PREDICTED_SLO_MET, policy, RouterState())
    req = RouteRequest(MODEL, slo=SLO, affinity=KEY, home=home.url)
    got = AFF(req, d, replace(s, curves=curves))
    assert got.candidates[0] is (home if goes_home else T0), case


# -- a declared session seen for the first time: its own backend of the policy's tier ---------


@pytest.mark.parametrize(
    ("case", "inflight", "expected_first"),
    [
        ("idle tier: the key's first choice", {}, FIRST),
        ("first choice at the mean: still it", {T0: 1, T1: 1, T2: 1, T3: 1}, FIRST),
        # 3 in flight, one more: bound ceil(1.25 * 4 / 4) + 2 = 4
        ("first choice past the bound: the second", {FIRST: 4}, SECOND),
        ("first choice at the bound: still it", {FIRST: 3}, FIRST),
        # 12 in flight, one more: bound ceil(1.25 * 13 / 4) + 2 = 7
        ("hot key spills at the bound", {FIRST: 7, SECOND: 3, T0: 1, T1: 1} | {FIRST: 7}, None),
    ],
)
def test_the_keyed_backend_goes_first_within_the_bound(
    case: str, inflight: dict[object, int], expected_first: object
) -> None:
    policy_order = (L0, *sorted(POOL, key=lambda b: inflight.get(b, 0)))
    thr_first = (*(b for b in policy_order if b is not L0), L0)
    d = AFF(SESSION, decide(thr_first), snapshot(inflight))  # type: ignore[arg-type]
    first = d.candidates[0]
    total = sum(inflight.values())
    bound = AFF.bound([inflight.get(b, 0) for b in POOL])
    assert bound == max(1, math.ceil(1.25 * (total + 1) / 4)) + 2
    assert inflight.get(first, 0) + 1 <= bound, case
    if expected_first is not None:
        assert first is expected_first, case
    # Nothing lost, nothing added, the other tier still last.
    assert sorted(urls(d)) == sorted(b.url for b in thr_first)
    assert d.candidates[-1] is L0


def test_the_other_tier_and_unkeyed_requests_are_left_alone() -> None:
    s = snapshot({})
    lat_first = decide((L0, T0, T1, T2, T3))
    # one backend there: the session's own, as the policy chose it
    assert AFF(SESSION, lat_first, s) == lat_first._replace(affinity=Stay.SESSION)
    thr_first = decide((T3, T2, T1, T0, L0))
    assert AFF(RouteRequest(MODEL), thr_first, s) is thr_first


@pytest.mark.parametrize(
    "reason", [Reason.SATURATED, Reason.NO_BACKEND, Reason.EXPLORE, Reason.POLICY_ERROR]
)
def test_decisions_with_a_reason_of_their_own_keep_their_first(reason: str) -> None:
    d = decide((T3, T2, T1, T0, L0), reason)
    assert AFF(SESSION, d, snapshot({})) == d._replace(affinity=Stay.POLICY)  # type: ignore[arg-type]
    home = RouteRequest(MODEL, affinity=KEY, home=T2.url)
    went = AFF(home, d, snapshot({}))  # type: ignore[arg-type]
    # Exploration tries another backend with a request that has no home to lose.
    assert went.candidates[0] is (T2 if reason == Reason.EXPLORE else T3)
    assert went.affinity == (Stay.HOME if reason == Reason.EXPLORE else Stay.POLICY)


def test_a_home_kept_for_a_tighter_class_is_not_gone_back_to() -> None:
    d = decide((T3, T2, T1, T0, L0), Reason.RESERVED)
    home = RouteRequest(MODEL, affinity=KEY, home=L0.url)
    assert AFF(home, d, snapshot({})) == d._replace(affinity=Stay.POLICY)  # type: ignore[arg-type]


def test_a_saturated_backend_is_never_chosen_for_affinity() -> None:
    # max_waiting 8: a fresh queue of 9 saturates the key's first choice.
    loaded = {b: load() for b in POOL} | {FIRST: load(running=0, waiting=9)}
    s = snap((L0, load()), *((b, loaded[b]) for b in POOL))
    d = AFF(SESSION, decide((*POOL, L0)), s)
    assert d.candidates[0] is SECOND


def test_keys_spread_over_the_pool_and_stick() -> None:
    """Many sessions on an idle pool: each keeps its backend decision after decision, and the
    keys spread over every backend."""
    s = snapshot({})
    firsts = {}
    for k in range(400):
        key = affinity_key(f"conversation-{k}".encode())
        req = RouteRequest(MODEL, affinity=key, session=True)
        d = AFF(req, decide((*POOL, L0)), s)  # type: ignore[arg-type]
        again = AFF(req, decide((*reversed(POOL), L0)), s)  # type: ignore[arg-type]
        assert d.candidates[0] is again.candidates[0]
        firsts[key] = d.candidates[0]
    spread = collections.Counter(b.url for b in firsts.values())
    assert len(spread) == 4
    assert min(spread.values()) > 60  # ~100 each


def test_a_hot_session_never_takes_a_backend_past_the_bound() -> None:
    """One session for everything, requests arriving while none finishes: affinity fills the
    session's backend to the bound, then spills, and no backend ever exceeds the bound. (A hot
    prompt prefix has no home: its requests hold it at once, and go by the policy.)"""
    inflight: dict[object, int] = {}
    rng = random.Random(1)
    for _ in range(200):
        order = tuple(sorted(POOL, key=lambda b: (inflight.get(b, 0), rng.random())))
        before = [inflight.get(b, 0) for b in POOL]
        d = AFF(SESSION, decide((*order, L0)), snapshot(inflight))  # type: ignore[arg-type]
        first = d.candidates[0]
        inflight[first] = inflight.get(first, 0) + 1
        assert inflight[first] <= AFF.bound(before)
    assert inflight[FIRST] == math.ceil(1.25 * 200 / 4) + 2


SYSTEM = {"role": "system", "content": "S"}
Q1, A1, Q2 = ({"role": r, "content": c} for r, c in (("user", "Q1"), ("assistant", "A1"),
                                                     ("user", "Q2")))  # fmt: skip
LONG = "x" * 1024


@pytest.mark.parametrize(
    ("session", "data", "chat", "same_as"),
    [
        (b"s-1", {"prompt": "anything"}, False, (b"s-1", {"prompt": "else"}, False)),
        (None, {"user": "u1", "prompt": "a"}, False, (None, {"user": "u1", "prompt": "b"}, False)),
        # A conversation: later turns share its opening (system prompt + first question).
        (None, {"messages": [SYSTEM, Q1]}, True, (None, {"messages": [SYSTEM, Q1, A1, Q2]}, True)),
        # A prompt: its first 1,024 characters.
        (None, {"prompt": LONG + "tail-1"}, False, (None, {"prompt": LONG + "tail-2"}, False)),
        (None, {"prompt": [[1, 2, 3]]}, False, (None, {"prompt": [1, 2, 3]}, False)),
    ],
)
def test_requests_that_share_a_prefix_share_a_key(
    session: bytes | None,
    data: dict[str, object],
    chat: bool,
    same_as: tuple[bytes | None, dict[str, object], bool],
) -> None:
    key = affinity_of(session, data, chat)
    assert key is not None
    assert key == affinity_of(*same_as)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"messages": [Q1]}, {"messages": [Q2]}),
        ({"messages": [SYSTEM, Q1]}, {"messages": [{"role": "system", "content": "S2"}, Q1]}),
    ],
)
def test_different_conversations_have_different_keys(
    a: dict[str, object], b: dict[str, object]
) -> None:
    assert affinity_of(None, a, True) != affinity_of(None, b, True)


@pytest.mark.parametrize(
    ("data", "chat"), [({"prompt": ""}, False), ({"messages": []}, True), ({}, False)]
)
def test_nothing_to_key_on(data: dict[str, object], chat: bool) -> None:
    assert affinity_of(None, data, chat) is None


@pytest.mark.parametrize(
    ("case", "chat", "data"),
    [
        ("the fewest token ids, one digit each", False, {"prompt": [0] * 256}),
        ("the fewest characters", False, {"prompt": "x" * 1024}),
        ("a batch of empty prompts", False, {"prompt": [""] * 256}),
        ("a chat past its opening", True, {"messages": [{}, {}, {}]}),
    ],
)
def test_a_body_too_short_for_a_later_turn_holds_none(
    case: str, chat: bool, data: dict[str, object]
) -> None:
    """The intake asks `later_turn` only of a body of `_LATER_BODY` bytes or more: the
    shortest bodies it says yes to, written as compactly as JSON allows, are no shorter; one
    element less, and it says no."""
    body = json.dumps(data, separators=(",", ":")).encode()
    assert later_turn(data, chat)
    assert len(body) >= _LATER_BODY[chat]
    short = {k: v[:-1] for k, v in data.items()}
    assert not later_turn(short, chat)
