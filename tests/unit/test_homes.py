"""Where affinity keys were served last (gateway.pipeline.homes), on a virtual clock: a key
served lately is a request's home; a key new, forgotten, stale or in use by another request now
is not; the memory stays within its capacity."""

from __future__ import annotations

import logging
import random

import pytest

from gateway.core.exchange import Endpoint, Exchange
from gateway.pipeline.homes import Homes
from gateway.routing import Backend, Role

A = Backend("http://a:1", "pool", Role.THROUGHPUT, frozenset({"m"}))
B = Backend("http://b:1", "fast", Role.LATENCY, frozenset({"m"}))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _send(message: object) -> None:
    pass


def exchange(key: int | None) -> Exchange:
    ex = Exchange("r", Endpoint("/v1/chat/completions", True), {}, _send, 0.0)
    ex.affinity = key
    return ex


def served(homes: Homes, key: int, backend: Backend | None, status: int = 200) -> Exchange:
    ex = exchange(key)
    homes.begin(ex)
    ex.backend, ex.status = backend, status
    homes.end(ex)
    return ex


@pytest.mark.parametrize(
    ("case", "before", "expected"),
    [
        ("new key", [], None),
        ("served by A", [(A, 200)], A.url),
        ("served by A, then B", [(A, 200), (B, 200)], B.url),
        ("A answered with an error", [(A, 500)], None),
        ("A answered, then an error on B", [(A, 200), (B, 502)], A.url),
        ("nothing answered", [(None, 0)], None),
    ],
)
def test_a_key_served_lately_is_a_home(
    case: str, before: list[tuple[Backend | None, int]], expected: str | None
) -> None:
    homes = Homes(16, 60.0, Clock())
    for backend, status in before:
        served(homes, 7, backend, status)
    ex = exchange(7)
    homes.begin(ex)
    assert ex.home == expected, case


def test_a_key_in_use_by_another_request_has_no_home() -> None:
    """A prefix requests share at once goes by the policy; once they are over it has one."""
    homes = Homes(16, 60.0, Clock())
    served(homes, 7, A)
    first, second = exchange(7), exchange(7)
    homes.begin(first)
    homes.begin(second)
    assert first.home == A.url
    assert second.home is None
    for ex in (first, second):
        ex.backend, ex.status = B, 200
        homes.end(ex)
    third = exchange(7)
    homes.begin(third)
    assert third.home == B.url


def test_a_stale_key_is_routed_as_new() -> None:
    clock = Clock()
    homes = Homes(16, 60.0, clock)
    served(homes, 7, A)
    clock.now = 59.0
    ex = exchange(7)
    homes.begin(ex)
    assert ex.home == A.url
    ex.backend, ex.status = A, 200
    homes.end(ex)
    clock.now = 59.0 + 60.5
    late = exchange(7)
    homes.begin(late)
    assert late.home is None


def test_capacity_forgets_the_least_recently_used() -> None:
    homes = Homes(3, 60.0, Clock())
    for key in (1, 2, 3):
        served(homes, key, A)
    again = exchange(1)  # key 1 used again: key 2 is now the least recently used
    homes.begin(again)
    again.backend, again.status = A, 200
    homes.end(again)
    served(homes, 4, B)
    assert len(homes) == 3
    # (Key 2 last: looking it up remembers it again, which forgets another.)
    for key, home in ((1, A.url), (3, A.url), (4, B.url), (2, None)):
        ex = exchange(key)
        homes.begin(ex)
        assert ex.home == home, key
        homes.end(ex)


def test_unkeyed_requests_are_not_remembered() -> None:
    homes = Homes(3, 60.0, Clock())
    ex = exchange(None)
    homes.begin(ex)
    ex.backend, ex.status = A, 200
    homes.end(ex)
    assert len(homes) == 0
    assert ex.home is None


def keys(homes: Homes, key: int, later: bool = False) -> bool:
    """Whether the intake keys a request with no declared session: every one while it is not
    quiet; while it is, one drawn in `every`, and a chat's later turn (`later`) whose key is
    remembered."""
    return next(homes.draw) or (later and key in homes)


def keyed(homes: Homes, key: int) -> Exchange | None:
    """A one-off request as the intake keys it, served by A (None: not keyed at all)."""
    return served(homes, key, A) if keys(homes, key) else None


def test_new_keys_in_a_row_make_it_quiet_and_a_repeat_ends_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gateway.pipeline.homes")
    homes = Homes(1024, 60.0, Clock(), quiet=(4, 3), rng=random.Random(1))
    for key in range(4):
        assert keyed(homes, key) is not None
    assert not homes.everyone  # four new keys in a row, none again
    assert "4 new prompts in a row, none seen again: one new key in 3" in caplog.text
    # Quiet: about one new key in three remembered, the others not keyed at all.
    got = [keyed(homes, key) is not None for key in range(100, 400)]
    assert 70 <= sum(got) <= 130
    assert len(homes) == 4 + sum(got)
    # A key remembered while quiet comes again (a chat's later turn, looked up): it has its
    # home, and every key is kept again.
    remembered = 100 + got.index(True)
    again = exchange(remembered)
    assert remembered in homes
    assert 99 not in homes
    homes.begin(again)
    assert again.home == A.url
    assert homes.everyone
    assert "came again: every key remembered" in caplog.text
    assert keyed(homes, 500) is not None
    assert keyed(homes, 501) is not None


@pytest.mark.parametrize("between", [1, 2, 3, 7])
def test_a_conversation_starting_while_quiet_is_found_at_a_later_turn(between: int) -> None:
    """A chat's turns come among prompts that never repeat, in step with them or not: one of
    its turns is remembered, its next turn finds it, and every key is remembered again."""
    homes = Homes(1024, 60.0, Clock(), quiet=(8, 4), rng=random.Random(between))
    serial = iter(range(1_000, 10_000))
    for _ in range(8):
        keyed(homes, next(serial))
    assert not homes.everyone
    conversation, found = 7, None
    for turn in range(1, 41):
        for _ in range(between):  # one-off prompts between its turns
            keyed(homes, next(serial))
        ex = exchange(conversation)
        if keys(homes, conversation, later=turn > 1):
            homes.begin(ex)
            if ex.home is not None:
                found = turn
                break
            ex.backend, ex.status = A, 200
            homes.end(ex)
    assert found is not None
    assert homes.everyone


def test_a_prompt_repeated_while_quiet_is_found_where_a_repeat_is_drawn() -> None:
    """A completion shows no turns: while it is quiet, a repeat of a remembered prompt is keyed
    only where it is drawn (one in `every`), and goes home then, which ends the quiet."""
    homes = Homes(1024, 60.0, Clock(), quiet=(8, 4), rng=random.Random(5))
    for key in range(8):
        keyed(homes, key)
    assert not homes.everyone
    repeats = 0
    while (ex := keyed(homes, 3)) is None:
        repeats += 1
        assert repeats < 200
    assert ex.home == A.url
    assert homes.everyone


def test_never_quiet_with_quiet_zero() -> None:
    homes = Homes(1024, 60.0, Clock())  # quiet=(0, 1): the constructor's default
    for key in range(2_000):
        served(homes, key, A)
    assert homes.everyone
    assert len(homes) == 1024


def test_the_draws_while_quiet_are_one_in_every_past_each_block() -> None:
    """While quiet each request is keyed with a chance of one in `every`, every draw a new one
    (no run of them repeats: a repeated pattern would pass over a conversation whose turns
    come in step with it); not quiet, every request is."""
    homes = Homes(1024, 60.0, Clock(), quiet=(2, 8), rng=random.Random(3))
    assert all(next(homes.draw) for _ in range(5_000))
    served(homes, 1, A)
    served(homes, 2, A)
    assert not homes.everyone
    draws = [next(homes.draw) for _ in range(40_960)]
    assert 40_960 / 8 * 0.9 <= sum(draws) <= 40_960 / 8 * 1.1
    blocks = [tuple(draws[i : i + 1024]) for i in range(0, 40_960, 1024)]
    assert len(set(blocks)) == len(blocks)
    served(homes, 1, A)  # a key again: every request keyed again
    assert homes.everyone
    assert all(next(homes.draw) for _ in range(5_000))
