"""In what order a pool is tried (gateway.routing.order)."""

from __future__ import annotations

import random

import pytest

from gateway.routing import Backend, BackendLoad, LoadSnapshot
from gateway.routing.order import Ordering, by_load, two_choices
from gateway.routing.saturation import Saturation
from tests.unit.routingfixtures import L0, L1, T0, T1, T2, T3, T4, P, load, snap

BY_LOAD: dict[str, tuple[LoadSnapshot, list[Backend]]] = {
    "least-effective-first": (snap((T0, load(3)), (T1, load(1)), (T2, load(2))), [T1, T2, T0]),
    "inflight-above-scrape-counts": (snap((T0, load(0, inflight=5)), (T1, load(3))), [T1, T0]),
    "waiting-counts": (snap((T0, load(1, 4)), (T1, load(3))), [T1, T0]),
    "stale-uses-inflight": (snap((T0, load(40, stale=True, inflight=1)), (T1, load(2))), [T0, T1]),
    "unscraped-is-idle": (snap((T0, None), (T1, load(1))), [T0, T1]),
    "roles-do-not-matter": (snap((L0, load(5)), (T0, load(6)), (L1, load(4))), [L1, L0, T0]),
    "empty": (snap(), []),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("snapshot", "expected"), BY_LOAD.values(), ids=BY_LOAD.keys())
def test_by_load(snapshot: LoadSnapshot, expected: list[Backend], seed: int) -> None:
    rng = random.Random(seed)
    assert by_load(snapshot.backends, snapshot, rng) == expected
    # one tie-break draw per backend, whether or not there is a tie
    assert rng.getstate() == _after_draws(seed, len(expected))


def _after_draws(seed: int, n: int) -> object:
    rng = random.Random(seed)
    for _ in range(n):
        rng.random()
    return rng.getstate()


@pytest.mark.parametrize("seed", range(20))
def test_by_load_ties_follow_the_draws_in_pool_order(seed: int) -> None:
    pool = [T0, T1, T2, T3]
    s = snap((T0, load(2)), (T1, load(2)), (T2, load(1)), (T3, load(2)))
    gen = random.Random(seed)
    draws = [gen.random() for _ in pool]
    tied = sorted([T0, T1, T3], key=lambda b: draws[pool.index(b)])
    assert by_load(pool, s, random.Random(seed)) == [T2, *tied]


TWO = {
    "spread": ([T0, T1, T2, T3, T4], [4, 0, 3, 1, 2]),
    "tied-pair-keeps-the-first-sampled": ([T0, T1, T2], [1, 1, 1]),
    "two": ([T0, T1], [5, 2]),
}


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize(("pool", "loads"), TWO.values(), ids=TWO.keys())
def test_two_choices(pool: list[Backend], loads: list[int], seed: int) -> None:
    s = snap(*((b, load(n)) for b, n in zip(pool, loads, strict=True)))
    got = two_choices(pool, s, random.Random(seed))
    # The first draw is the sample; the lighter of the two leads, the first sampled on a tie.
    a, b = random.Random(seed).sample(pool, 2)
    first = b if loads[pool.index(b)] < loads[pool.index(a)] else a
    assert got[0] == first
    assert sorted(got, key=pool.index) == pool  # each backend once
    rest_loads = [loads[pool.index(x)] for x in got[1:]]
    assert rest_loads == sorted(rest_loads)


def test_two_choices_never_leads_with_the_busiest() -> None:
    pool = [T0, T1, T2, T3, T4]
    s = snap(*((b, load(n)) for b, n in zip(pool, [0, 1, 2, 3, 4], strict=True)))
    firsts = {two_choices(pool, s, random.Random(seed))[0] for seed in range(200)}
    assert firsts == {T0, T1, T2, T3}


ORDERING = Ordering(Saturation.of(P), p2c_min_pool=4)  # hard cap 24, max_waiting 8

# Deterministic rows: fewer than p2c_min_pool backends with room, so no sampling.
THROUGHPUT: dict[str, tuple[LoadSnapshot, list[Backend]]] = {
    "saturated-go-last-even-when-lighter": (
        snap((T0, load(0, 9)), (T1, load(12)), (T2, load(5))),
        [T2, T1, T0],
    ),
    "saturated-among-themselves-by-load": (
        snap((T0, load(1, 12)), (T1, load(2, 9)), (T2, load(30))),
        [T2, T1, T0],
    ),
    "waiting-at-max-has-room": (snap((T0, load(0, 8)), (T1, load(1, 9))), [T0, T1]),
    "stale-queue-is-not-saturation": (
        snap((T0, load(40, 30, stale=True, inflight=5)), (T1, load(1, 9))),
        [T0, T1],
    ),
    "saturated-do-not-count-toward-p2c": (
        snap((T0, load(0, 9)), (T1, load(0, 10)), (T2, load(3)), (T3, load(1)), (T4, load(2))),
        [T3, T4, T2, T0, T1],
    ),
    "all-saturated": (snap((T0, load(0, 10)), (T1, load(0, 9))), [T1, T0]),
    "empty": (snap(), []),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("snapshot", "expected"), THROUGHPUT.values(), ids=THROUGHPUT.keys())
def test_throughput_order(snapshot: LoadSnapshot, expected: list[Backend], seed: int) -> None:
    assert ORDERING.throughput(snapshot.backends, snapshot, random.Random(seed)) == expected


P2C: dict[str, tuple[list[BackendLoad], int]] = {
    "four-with-room-at-four": ([load(4), load(0), load(3), load(1)], 4),
    "five-with-room-one-full": ([load(0, 9), load(5), load(6), load(7), load(8)], 4),
    "two-with-room-at-two": ([load(3), load(1), load(0, 20)], 2),
}


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize(("loads", "p2c_min_pool"), P2C.values(), ids=P2C.keys())
def test_throughput_order_two_choices(
    loads: list[BackendLoad], p2c_min_pool: int, seed: int
) -> None:
    pool = [T0, T1, T2, T3, T4][: len(loads)]
    s = snap(*zip(pool, loads, strict=True))
    ordering = Ordering(Saturation.of(P), p2c_min_pool=p2c_min_pool)
    got = ordering.throughput(pool, s, random.Random(seed))
    room = [b for b, bl in zip(pool, loads, strict=True) if bl.waiting <= P.max_waiting]
    full = [b for b in pool if b not in room]
    assert got == two_choices(room, s, random.Random(seed)) + got[len(room) :]
    assert set(got[len(room) :]) == set(full)


def test_latency_order_is_by_load_whatever_the_cap() -> None:
    s = snap((L0, load(30)), (L1, load(2)))
    assert ORDERING.latency([L0, L1], s, random.Random(0)) == [L1, L0]
