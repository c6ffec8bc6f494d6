"""The routing policies end to end, as built from the catalog (gateway.routing.build_policy).

Each stage has its own tables: test_routing_filters, _saturation, _order, _golden, _params,
_types.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from gateway.routing import (
    DEFAULT_POLICY,
    POLICIES,
    POLICY_NAMES,
    Backend,
    BackendLoad,
    LoadSnapshot,
    ParamError,
    PolicyParams,
    Reason,
    Role,
    RouteRequest,
    RouterState,
    build_policy,
)
from gateway.routing.golden import GoldenRange
from gateway.routing.learned import Learned
from tests.unit.routingfixtures import (
    CLOSED,
    L0,
    L1,
    MODEL,
    OPEN,
    OTHER,
    POOL,
    SATURATED_POOL,
    T0,
    T1,
    T2,
    T3,
    T4,
    T_OTHER,
    P,
    load,
    names,
    snap,
    urls,
)


def golden(params: PolicyParams = P) -> GoldenRange:
    policy = build_policy("golden-range", params)
    assert isinstance(policy, GoldenRange)
    return policy


@dataclass(frozen=True)
class Case:
    snapshot: LoadSnapshot
    expected: list[Backend]
    reason: Reason
    state: RouterState = OPEN
    next_state: RouterState | None = None  # None: unchanged
    req: RouteRequest = field(default_factory=lambda: RouteRequest(MODEL))
    params: PolicyParams = P


GOLDEN_CASES = {
    "below-cap-latency-first": Case(
        snap((L0, load(5)), *POOL), [L0, T1, T2, T0], Reason.GOLDEN_RANGE
    ),
    "just-below-cap": Case(snap((L0, load(10, 5)), *POOL), [L0, T1, T2, T0], Reason.GOLDEN_RANGE),
    "at-cap-closes": Case(
        snap((L0, load(16)), *POOL), [T1, T2, T0, L0], Reason.LATENCY_FULL, OPEN, CLOSED
    ),
    "above-cap-closes-on-inflight": Case(
        snap((L0, load(4, inflight=17)), *POOL), [T1, T2, T0, L0], Reason.LATENCY_FULL, OPEN, CLOSED
    ),
    "closed-stays-closed-below-cap": Case(
        snap((L0, load(15)), *POOL), [T1, T2, T0, L0], Reason.HYSTERESIS, CLOSED
    ),
    "closed-at-reopen-boundary": Case(
        snap((L0, load(14)), *POOL), [T1, T2, T0, L0], Reason.HYSTERESIS, CLOSED
    ),
    "closed-reopens-below-cap-minus-hysteresis": Case(
        snap((L0, load(13)), *POOL), [L0, T1, T2, T0], Reason.GOLDEN_RANGE, CLOSED, OPEN
    ),
    "no-hysteresis-reopens-just-below-cap": Case(
        snap((L0, load(15)), *POOL),
        [L0, T1, T2, T0],
        Reason.GOLDEN_RANGE,
        CLOSED,
        OPEN,
        params=PolicyParams(hysteresis=0),
    ),
    "second-latency-backend-adds-room": Case(
        snap((L0, load(16)), (L1, load(3)), *POOL), [L1, L0, T1, T2, T0], Reason.GOLDEN_RANGE
    ),
    "pinned-latency-over-cap": Case(
        snap((L0, load(20)), *POOL),
        [L0],
        Reason.PINNED,
        OPEN,
        CLOSED,  # the pin does not stop the state from tracking the tier's level
        req=RouteRequest(MODEL, pinned=Role.LATENCY),
    ),
    "pinned-latency-past-hard-cap-is-saturated": Case(
        snap((L0, load(30)), *POOL),
        [L0],
        Reason.SATURATED,
        CLOSED,
        req=RouteRequest(MODEL, pinned=Role.LATENCY),
    ),
    "pinned-throughput-while-latency-idle": Case(
        snap((L0, load(0)), *POOL),
        [T1, T2, T0],
        Reason.PINNED,
        req=RouteRequest(MODEL, pinned=Role.THROUGHPUT),
    ),
    "pinned-throughput-all-queued-is-saturated": Case(
        snap((L0, load(0)), *SATURATED_POOL),
        [T0, T1, T2],
        Reason.SATURATED,
        req=RouteRequest(MODEL, pinned=Role.THROUGHPUT),
    ),
    "pinned-tier-absent-no-failover": Case(
        snap(*POOL), [], Reason.NO_BACKEND, req=RouteRequest(MODEL, pinned=Role.LATENCY)
    ),
    "overflow-when-pool-saturated": Case(
        snap((L0, load(18)), *SATURATED_POOL), [L0, T0, T1, T2], Reason.OVERFLOW, CLOSED
    ),
    "overflow-up-to-hard-cap": Case(
        snap((L0, load(23)), *SATURATED_POOL), [L0, T0, T1, T2], Reason.OVERFLOW, OPEN, CLOSED
    ),
    "everything-saturated": Case(
        snap((L0, load(24)), *SATURATED_POOL), [T0, T1, T2, L0], Reason.SATURATED, CLOSED
    ),
    "waiting-equal-to-max-is-not-saturated": Case(
        snap((L0, load(20)), (T0, load(0, 8)), (T1, load(1, 9))),
        [T0, T1, L0],
        Reason.LATENCY_FULL,
        CLOSED,
    ),
    "queued-backend-ranks-after-one-with-room": Case(
        # T0 has the lower running+waiting but a queue past max_waiting: it cannot batch more.
        snap((L0, load(16)), (T0, load(0, 9)), (T1, load(12))),
        [T1, T0, L0],
        Reason.LATENCY_FULL,
        CLOSED,
    ),
    "stale-queue-does-not-saturate": Case(
        snap((L0, load(18)), (T0, load(1, 9)), (T1, load(40, 30, inflight=5, stale=True))),
        [T1, T0, L0],
        Reason.LATENCY_FULL,
        CLOSED,
    ),
    "past-golden-range-shares-with-a-busier-pool": Case(
        # 18 on the latency tier, every throughput backend busier: latency still wins per token.
        snap((L0, load(18)), (T0, load(20)), (T1, load(25)), (T2, load(22))),
        [L0, T0, T2, T1],
        Reason.SHARED,
        CLOSED,
    ),
    "past-golden-range-tie-goes-to-the-pool": Case(
        snap((L0, load(20)), (T0, load(20)), (T1, load(25)), (T2, load(22))),
        [T0, T2, T1, L0],
        Reason.LATENCY_FULL,
        CLOSED,
    ),
    "sharing-stops-at-the-hard-cap": Case(
        snap((L0, load(24)), (T0, load(30)), (T1, load(31)), (T2, load(40))),
        [T0, T1, T2, L0],
        Reason.LATENCY_FULL,
        CLOSED,
    ),
    "sharing-compares-with-the-least-loaded-pool-backend": Case(
        snap((L0, load(19)), (T0, load(18)), (T1, load(40)), (T2, load(41))),
        [T0, T1, T2, L0],
        Reason.LATENCY_FULL,
        CLOSED,
    ),
    "latency-only-deployment-overflows": Case(snap((L0, load(17))), [L0], Reason.OVERFLOW, CLOSED),
    "latency-only-deployment-saturated": Case(snap((L0, load(24))), [L0], Reason.SATURATED, CLOSED),
    "unhealthy-latency-skipped": Case(
        snap((L0, load(0, healthy=False)), *POOL), [T1, T2, T0], Reason.NO_LATENCY, CLOSED
    ),
    "unhealthy-throughput-skipped": Case(
        snap((L0, load(0)), (T0, load(3)), (T1, load(1, healthy=False)), (T2, load(2))),
        [L0, T2, T0],
        Reason.GOLDEN_RANGE,
    ),
    "stale-throughput-uses-inflight": Case(
        snap((L0, load(16)), (T0, load(50, inflight=0, stale=True)), (T1, load(1)), (T2, load(2))),
        [T0, T1, T2, L0],
        Reason.LATENCY_FULL,
        OPEN,
        CLOSED,
    ),
    "fresh-scrape-lagging-inflight-wins": Case(
        snap((L0, load(16)), (T0, load(0, inflight=7)), (T1, load(3)), (T2, load(5))),
        [T1, T2, T0, L0],
        Reason.LATENCY_FULL,
        CLOSED,
    ),
    "stale-latency-uses-inflight": Case(
        snap((L0, load(30, 5, inflight=2, stale=True)), *POOL),
        [L0, T1, T2, T0],
        Reason.GOLDEN_RANGE,
        CLOSED,
        OPEN,
    ),
    "unscraped-backend-counts-as-idle": Case(
        snap((L0, load(16)), (T0, load(3)), (T1, None)), [T1, T0, L0], Reason.LATENCY_FULL, CLOSED
    ),
    "exclude-latency": Case(
        snap((L0, load(0)), *POOL),
        [T1, T2, T0],
        Reason.NO_LATENCY,
        req=RouteRequest(MODEL, exclude=frozenset({L0.url})),
    ),
    "exclude-throughput": Case(
        snap((L0, load(0)), *POOL),
        [L0, T2, T0],
        Reason.GOLDEN_RANGE,
        req=RouteRequest(MODEL, exclude=frozenset({T1.url})),
    ),
    "model-filter": Case(
        snap((L0, load(0)), (T_OTHER, load(0)), *POOL), [L0, T1, T2, T0], Reason.GOLDEN_RANGE
    ),
    "other-model-only-its-backends": Case(
        snap((L0, load(0)), (T_OTHER, load(5)), *POOL),
        [T_OTHER],
        Reason.NO_LATENCY,
        req=RouteRequest(OTHER),
    ),
    "unknown-model-no-backend": Case(
        snap((L0, load(0)), *POOL), [], Reason.NO_BACKEND, req=RouteRequest("gpt-4")
    ),
    "all-unhealthy-no-backend": Case(
        snap((L0, load(healthy=False)), (T0, load(healthy=False))), [], Reason.NO_BACKEND
    ),
    "empty-snapshot-no-backend": Case(snap(), [], Reason.NO_BACKEND, CLOSED),
    "duplicate-url-listed-once": Case(
        snap((L0, load(0)), (T0, load(1)), (T0, load(1))), [L0, T0], Reason.GOLDEN_RANGE
    ),
}


@pytest.mark.parametrize("case", GOLDEN_CASES.values(), ids=GOLDEN_CASES.keys())
def test_golden_range(case: Case) -> None:
    d = golden(case.params)(case.req, case.snapshot, case.state, random.Random(0))
    assert urls(d) == names(*case.expected)
    assert d.reason == case.reason
    assert d.policy == "golden-range"
    assert d.state == (case.next_state or case.state)


def test_golden_range_hysteresis_walk() -> None:
    """The latency tier's level rises through the cap and falls back: no flapping at 15/16."""
    state = OPEN
    seen = []
    policy = golden()
    for level in [14, 15, 16, 15, 16, 15, 14, 13, 14, 15, 16]:
        d = policy(RouteRequest(MODEL), snap((L0, load(level)), *POOL), state, random.Random(1))
        assert d.primary is not None
        seen.append(d.primary.role)
        state = d.state
    lat_, thr_ = Role.LATENCY, Role.THROUGHPUT
    assert seen == [lat_, lat_, thr_, thr_, thr_, thr_, thr_, lat_, lat_, lat_, thr_]


@pytest.mark.parametrize("seed", range(200))
def test_p2c_primary_is_the_lighter_of_two_sampled(seed: int) -> None:
    pool = [T0, T1, T2, T3, T4]
    loads = [4, 0, 3, 1, 2]
    s = snap((L0, load(16)), *((b, load(n)) for b, n in zip(pool, loads, strict=True)))
    d = golden()(RouteRequest(MODEL), s, OPEN, random.Random(seed))
    # Same seed, same draw: the policy's first use of the rng is the two-choice sample.
    a, b = random.Random(seed).sample(pool, 2)
    expected = b if loads[pool.index(b)] < loads[pool.index(a)] else a
    assert d.primary == expected
    assert d.reason == Reason.LATENCY_FULL
    # failover: the rest of the pool by load, then the latency tier
    rest = sorted((x for x in pool if x != expected), key=lambda x: loads[pool.index(x)])
    assert urls(d) == names(expected, *rest, L0)


def test_p2c_spreads_load_but_never_picks_the_busiest() -> None:
    pool = [T0, T1, T2, T3, T4]
    s = snap(*((b, load(n)) for b, n in zip(pool, [0, 1, 2, 3, 4], strict=True)))
    policy = golden()
    picks = Counter(
        policy(RouteRequest(MODEL), s, OPEN, random.Random(seed)).primary for seed in range(400)
    )
    assert T4 not in picks  # the busiest loses every pairing
    assert set(picks) == {T0, T1, T2, T3}  # not plain least-loaded
    assert picks[T0] > picks[T1] > picks[T2] > picks[T3]  # 4/10, 3/10, 2/10, 1/10 of draws


def test_p2c_only_among_backends_with_room() -> None:
    pool = [T0, T1, T2, T3, T4]
    loads = [load(0, 9), load(5), load(6), load(7), load(8)]  # T0 queued past max_waiting
    s = snap(*zip(pool, loads, strict=True))
    policy = golden()
    for seed in range(100):
        d = policy(RouteRequest(MODEL), s, OPEN, random.Random(seed))
        assert d.candidates[-1] == T0


def test_small_pool_is_plain_least_loaded() -> None:
    s = snap((T0, load(3)), (T1, load(1)), (T2, load(2)))
    policy = golden()
    primaries = {policy(RouteRequest(MODEL), s, OPEN, random.Random(k)).primary for k in range(50)}
    assert primaries == {T1}


def test_ties_broken_by_rng_not_config_order() -> None:
    s = snap((L0, load(16)), (T0, load(2)), (T1, load(2)), (T2, load(2)))
    policy = golden()
    orders = {
        tuple(urls(policy(RouteRequest(MODEL), s, OPEN, random.Random(k)))) for k in range(60)
    }
    assert len(orders) == 6  # every permutation of the three tied backends shows up
    assert all(o[-1] == L0.url for o in orders)


def test_same_seed_same_decision_and_inputs_untouched() -> None:
    loads = {L0.url: load(16), T0.url: load(1), T1.url: load(1), T2.url: load(1), T3.url: load(1)}
    s = LoadSnapshot(backends=(L0, T0, T1, T2, T3), loads=loads, taken_at=5.0)
    req = RouteRequest(MODEL)
    policy = golden()
    first = policy(req, s, OPEN, random.Random(42))
    loads[T0.url] = load(99)  # the snapshot copied the mapping: this changes nothing
    assert policy(req, s, OPEN, random.Random(42)) == first
    assert s.load(T0.url) == load(1)
    assert s.taken_at == 5.0


# Comparison policies. Fixture: L0 at 10, T0..T2 at 3/1/2: least-loaded mixes tiers.
MIXED = snap((L0, load(10)), *POOL)

COMPARISON_CASES = {
    "least-loaded-mixes-tiers": (
        "least-loaded",
        MIXED,
        RouteRequest(MODEL),
        [T1, T2, T0, L0],
        Reason.LEAST_LOADED,
    ),
    "least-loaded-latency-when-lightest": (
        "least-loaded",
        snap((L0, load(0)), *POOL),
        RouteRequest(MODEL),
        [L0, T1, T2, T0],
        Reason.LEAST_LOADED,
    ),
    "least-loaded-pinned": (
        "least-loaded",
        MIXED,
        RouteRequest(MODEL, pinned=Role.LATENCY),
        [L0],
        Reason.PINNED,
    ),
    "least-loaded-saturated": (
        "least-loaded",
        snap((L0, load(30)), *SATURATED_POOL),
        RouteRequest(MODEL),
        [T0, T1, T2, L0],
        Reason.SATURATED,
    ),
    "round-robin-starts-at-config-order": (
        "round-robin",
        MIXED,
        RouteRequest(MODEL),
        [L0, T0, T1, T2],
        Reason.ROUND_ROBIN,
    ),
    "round-robin-skips-excluded": (
        "round-robin",
        MIXED,
        RouteRequest(MODEL, exclude=frozenset({L0.url})),
        [T0, T1, T2],
        Reason.ROUND_ROBIN,
    ),
    "latency-only-even-when-busy": (
        "latency-only",
        MIXED,
        RouteRequest(MODEL),
        [L0, T1, T2, T0],
        Reason.PREFERRED_TIER,
    ),
    "latency-only-falls-back": (
        "latency-only",
        snap((L0, load(healthy=False)), *POOL),
        RouteRequest(MODEL),
        [T1, T2, T0],
        Reason.FALLBACK_TIER,
    ),
    "throughput-only-latency-last": (
        "throughput-only",
        snap((L0, load(0)), *POOL),
        RouteRequest(MODEL),
        [T1, T2, T0, L0],
        Reason.PREFERRED_TIER,
    ),
    "throughput-only-falls-back": (
        "throughput-only",
        snap((L0, load(0)), (T0, load(healthy=False))),
        RouteRequest(MODEL),
        [L0],
        Reason.FALLBACK_TIER,
    ),
    "throughput-only-pinned-latency": (
        "throughput-only",
        MIXED,
        RouteRequest(MODEL, pinned=Role.LATENCY),
        [L0],
        Reason.PINNED,
    ),
}


@pytest.mark.parametrize(
    ("policy", "snapshot", "req", "expected", "reason"),
    COMPARISON_CASES.values(),
    ids=COMPARISON_CASES.keys(),
)
def test_comparison_policies(
    policy: str, snapshot: LoadSnapshot, req: RouteRequest, expected: list[Backend], reason: Reason
) -> None:
    d = build_policy(policy, P)(req, snapshot, OPEN, random.Random(0))
    assert urls(d) == names(*expected)
    assert d.reason == reason
    assert d.policy == policy


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_no_backend(policy: str) -> None:
    d = build_policy(policy, P)(RouteRequest("unknown"), MIXED, OPEN, random.Random(0))
    assert d.candidates == ()
    assert d.primary is None
    assert d.reason == Reason.NO_BACKEND


def test_round_robin_rotates_through_state() -> None:
    state = RouterState()
    primaries = []
    policy = build_policy("round-robin", P)
    for _ in range(6):
        d = policy(RouteRequest(MODEL), MIXED, state, random.Random(0))
        assert d.primary is not None
        primaries.append(d.primary)
        # the whole rotation is the failover order
        start = [L0, T0, T1, T2].index(d.primary)
        assert list(d.candidates) == ([L0, T0, T1, T2] * 2)[start : start + 4]
        state = d.state
    assert primaries == [L0, T0, T1, T2, L0, T0]
    assert state.latency_open  # round-robin leaves the hysteresis state alone


def test_round_robin_ignores_load() -> None:
    s = snap((T0, load(100)), (T1, load(0)))
    d = build_policy("round-robin", P)(RouteRequest(MODEL), s, RouterState(rr=0), random.Random(0))
    assert d.primary == T0


def test_catalog() -> None:
    seven = {"learned", "golden-range", "least-loaded", "power-of-two", "round-robin",
             "latency-only", "throughput-only"}  # fmt: skip
    assert set(POLICIES) == set(POLICY_NAMES) == seven
    assert DEFAULT_POLICY == "learned"
    policy = build_policy(DEFAULT_POLICY, P)
    assert isinstance(policy, Learned)
    assert policy.name == DEFAULT_POLICY
    with pytest.raises(ParamError, match="golden-range") as info:
        build_policy("random", P)
    assert info.value.field == "name"
    with pytest.raises(TypeError):
        POLICIES["mine"] = GoldenRange.build  # type: ignore[index]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_is_named_by_the_catalog(policy: str) -> None:
    built = build_policy(policy, P)
    assert built.name == policy
    assert built(RouteRequest(MODEL), MIXED, OPEN, random.Random(0)).policy == policy


def _random_scenario(
    rng: random.Random,
) -> tuple[RouteRequest, LoadSnapshot, RouterState, PolicyParams]:
    backends: list[Backend] = []
    for i in range(rng.randint(0, 9)):
        if backends and rng.random() < 0.1:
            backends.append(rng.choice(backends))  # the same backend listed twice
            continue
        models = frozenset(m for m in (MODEL, OTHER) if rng.random() < 0.7)
        role = rng.choice(list(Role))
        backends.append(Backend(f"http://b{i}:8000", role.value, role, models))
    loads = {
        b.url: BackendLoad(
            running=rng.randint(0, 40),
            waiting=rng.randint(0, 15),
            kv_usage=rng.random(),
            inflight=rng.randint(0, 40),
            healthy=rng.random() < 0.8,
            stale=rng.random() < 0.2,
        )
        for b in backends
        if rng.random() < 0.9
    }
    exclude = frozenset(b.url for b in backends if rng.random() < 0.2)
    req = RouteRequest(
        model=rng.choice([MODEL, MODEL, OTHER, "absent"]),
        pinned=rng.choice([None, None, Role.LATENCY, Role.THROUGHPUT]),
        stream=rng.random() < 0.5,
        exclude=exclude,
    )
    cap = rng.randint(1, 20)
    params = PolicyParams(
        latency_max_concurrency=cap,
        hysteresis=rng.randint(0, cap - 1),
        latency_hard_cap=cap + rng.randint(0, 10),
        max_waiting=rng.randint(0, 12),
        p2c_min_pool=rng.randint(2, 5),
    )
    state = RouterState(latency_open=rng.random() < 0.5, rr=rng.randint(0, 10))
    return req, LoadSnapshot(tuple(backends), loads, 0.0), state, params


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_property_candidates_are_exactly_the_eligible_backends(policy: str) -> None:
    """hypothesis is not a project dependency, so: 1,500 seeded random scenarios per policy."""
    gen = random.Random(f"routing-{policy}")
    for _ in range(1500):
        req, s, state, params = _random_scenario(gen)
        d = build_policy(policy, params)(req, s, state, random.Random(gen.random()))
        got = urls(d)
        assert len(got) == len(set(got)), "a backend repeats"
        for b in d.candidates:
            assert s.load(b.url).healthy, "unhealthy backend listed"
            assert b.url not in req.exclude, "excluded backend listed"
            assert req.model in b.models, "backend of another model listed"
            assert req.pinned is None or b.role is req.pinned, "pin ignored"
        # and nothing eligible is left out: the failover order is complete
        eligible = {
            b.url
            for b in s.backends
            if s.load(b.url).healthy
            and b.url not in req.exclude
            and req.model in b.models
            and (req.pinned is None or b.role is req.pinned)
        }
        assert set(got) == eligible
        assert (d.reason == Reason.NO_BACKEND) == (not got)
        assert d.reason in set(Reason)
        if d.reason in (Reason.GOLDEN_RANGE, Reason.OVERFLOW):
            assert d.candidates[0].role is Role.LATENCY
        if d.reason in (Reason.LATENCY_FULL, Reason.HYSTERESIS, Reason.NO_LATENCY):
            assert d.candidates[0].role is Role.THROUGHPUT


def _inflight(n: int) -> BackendLoad:
    return BackendLoad(inflight=n, stale=True)  # what a router that polls nothing knows


def test_power_of_two_takes_the_less_loaded_of_two_drawn() -> None:
    policy = build_policy("power-of-two", P)
    two = snap((T0, _inflight(5)), (T1, _inflight(1)))
    for seed in range(20):
        d = policy(RouteRequest(MODEL), two, OPEN, random.Random(seed))
        assert urls(d) == names(T1, T0)
        assert d.reason == Reason.TWO_CHOICES
    # Three: the busiest can never win a draw, and either idle one can; tiers do not matter.
    three = snap((L0, _inflight(0)), (T0, _inflight(9)), (T1, _inflight(0)))
    firsts = {policy(RouteRequest(MODEL), three, OPEN, random.Random(s)).primary
              for s in range(200)}  # fmt: skip
    assert firsts == {L0, T1}
    pinned = policy(RouteRequest(MODEL, pinned=Role.THROUGHPUT), three, OPEN, random.Random(0))
    assert pinned.reason == Reason.PINNED
    assert set(pinned.candidates) == {T0, T1}
