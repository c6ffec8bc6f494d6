"""Prefix-cache affinity inside a tier (gateway.routing.affinity), by tables of cases: the keyed
backend of the policy's tier goes first while it stays within the load bound; the other tier,
unkeyed requests and decisions with a reason of their own are left alone; the key comes from the
session, the user, the conversation's opening or the prompt's beginning."""

from __future__ import annotations

import collections
import math
import random

import pytest

from gateway.pipeline.intake import affinity_of
from gateway.routing import Decision, PolicyParams, Reason, RouteRequest, RouterState
from gateway.routing.affinity import Affinity, affinity_key, rank
from tests.unit.routingfixtures import L0, MODEL, T0, T1, T2, T3, load, snap, urls

AFF = Affinity.of(PolicyParams(prefix_affinity=True))
POOL = (T0, T1, T2, T3)
KEY = affinity_key(b"conversation-1")
# KEY's own order of the pool: its first choice, then its second...
FIRST, SECOND, *_ = rank(KEY, POOL)


def decide(order: tuple[object, ...], reason: str = Reason.LEAST_LOADED) -> Decision:
    return Decision(order, reason, "least-loaded", RouterState())  # type: ignore[arg-type]


def snapshot(inflight: dict[object, int]) -> object:
    return snap(*((b, load(inflight=inflight.get(b, 0))) for b in (L0, *POOL)))


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
    d = AFF(RouteRequest(MODEL, affinity=KEY), decide(thr_first), snapshot(inflight))  # type: ignore[arg-type]
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
    assert AFF(RouteRequest(MODEL, affinity=KEY), lat_first, s) is lat_first  # one backend there
    thr_first = decide((T3, T2, T1, T0, L0))
    assert AFF(RouteRequest(MODEL), thr_first, s) is thr_first


@pytest.mark.parametrize(
    "reason", [Reason.SATURATED, Reason.NO_BACKEND, Reason.EXPLORE, Reason.POLICY_ERROR]
)
def test_decisions_with_a_reason_of_their_own_keep_their_first(reason: str) -> None:
    d = decide((T3, T2, T1, T0, L0), reason)
    assert AFF(RouteRequest(MODEL, affinity=KEY), d, snapshot({})) is d


def test_a_saturated_backend_is_never_chosen_for_affinity() -> None:
    # max_waiting 8: a fresh queue of 9 saturates the key's first choice.
    loaded = {b: load() for b in POOL} | {FIRST: load(running=0, waiting=9)}
    s = snap((L0, load()), *((b, loaded[b]) for b in POOL))
    d = AFF(RouteRequest(MODEL, affinity=KEY), decide((*POOL, L0)), s)
    assert d.candidates[0] is SECOND


def test_keys_spread_over_the_pool_and_stick() -> None:
    """Many keys on an idle pool: each keeps its backend decision after decision, and the keys
    spread over every backend."""
    s = snapshot({})
    firsts = {}
    for k in range(400):
        key = affinity_key(f"conversation-{k}".encode())
        d = AFF(RouteRequest(MODEL, affinity=key), decide((*POOL, L0)), s)
        again = AFF(RouteRequest(MODEL, affinity=key), decide((*reversed(POOL), L0)), s)
        assert d.candidates[0] is again.candidates[0]
        firsts[key] = d.candidates[0]
    spread = collections.Counter(b.url for b in firsts.values())
    assert len(spread) == 4
    assert min(spread.values()) > 60  # ~100 each


def test_a_hot_key_never_takes_a_backend_past_the_bound() -> None:
    """One key for everything, requests arriving while none finishes: affinity fills its first
    choice to the bound, then spills, and no backend ever exceeds the bound."""
    inflight: dict[object, int] = {}
    rng = random.Random(1)
    for _ in range(200):
        order = tuple(sorted(POOL, key=lambda b: (inflight.get(b, 0), rng.random())))
        before = [inflight.get(b, 0) for b in POOL]
        d = AFF(RouteRequest(MODEL, affinity=KEY), decide((*order, L0)), snapshot(inflight))
        first = d.candidates[0]
        inflight[first] = inflight.get(first, 0) + 1
        assert inflight[first] <= AFF.bound(before)
    # The key's first choices fill to (1 + balance) x the mean + slack, the rest take the rest.
    assert max(inflight.values()) == math.ceil(1.25 * 200 / 4) + 2


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
