"""The retry executor and the retry budget, on a virtual clock."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from gateway.config.settings import RetryConfig
from gateway.pipeline.retry import Retryable, RetryBudget, RetryExecutor, within
from gateway.routing import Backend, Role


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Hooks:
    def __init__(self) -> None:
        self.failed: list[tuple[str, str, int]] = []
        self.retried: list[tuple[str, str]] = []
        self.exhausted = 0

    def attempt_failed(self, backend: Backend, error: Retryable, attempt: int) -> None:
        self.failed.append((backend.url, error.reason, attempt))

    def retrying(self, failed: Backend, error: Retryable) -> None:
        self.retried.append((failed.url, error.reason))

    def budget_exhausted(self) -> None:
        self.exhausted += 1


def backends(n: int) -> list[Backend]:
    return [Backend(f"http://b{i}", "t", Role.THROUGHPUT, frozenset({"m"})) for i in range(n)]


def executor(clock: Clock, hooks: Hooks, **cfg: float | int) -> RetryExecutor:
    return RetryExecutor(RetryConfig(**cfg), hooks, clock=clock, sleep=clock.sleep,
                         rng=random.Random(1))  # fmt: skip


def script(clock: Clock, outcomes: dict[str, str | None], cost: float = 0.0,
           ) -> tuple[list[str], Callable[[Backend], Awaitable[None]]]:  # fmt: skip
    """An attempt function: per backend, None succeeds, a string fails with that reason; each
    attempt takes `cost` seconds of virtual time."""
    tried: list[str] = []

    async def attempt(b: Backend) -> None:
        tried.append(b.url)
        clock.now += cost
        reason = outcomes.get(b.url)
        if reason is not None:
            raise Retryable(reason)

    return tried, attempt


# -- the executor ---------------------------------------------------------------------------------

Case = tuple[str, dict[str, float | int], dict[str, str | None], int, list[str], str | None]
CASES: list[Case] = [
    # name, config, outcomes by backend, backends, tried, last failure
    ("first succeeds", {}, {}, 3, ["http://b0"], None),
    ("second succeeds", {}, {"http://b0": "connect"}, 3, ["http://b0", "http://b1"], None),
    ("all fail, max 3", {}, {f"http://b{i}": "http_503" for i in range(5)}, 5,
     ["http://b0", "http://b1", "http://b2"], "http_503"),
    ("fewer candidates than attempts", {}, {"http://b0": "x", "http://b1": "y"}, 2,
     ["http://b0", "http://b1"], "y"),
    ("max_attempts 1 never retries", {"max_attempts": 1}, {"http://b0": "x"}, 3,
     ["http://b0"], "x"),
    ("max_attempts 5", {"max_attempts": 5}, {f"http://b{i}": "x" for i in range(4)}, 6,
     [f"http://b{i}" for i in range(5)], None),
]  # fmt: skip


@pytest.mark.parametrize(("cfg", "outcomes", "n", "tried", "last"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_candidates_in_order_until_one_answers(
    cfg: dict[str, float | int], outcomes: dict[str, str | None], n: int, tried: list[str],
    last: str | None,
) -> None:  # fmt: skip
    clock, hooks = Clock(), Hooks()
    ran, attempt = script(clock, outcomes)
    failed = asyncio.run(executor(clock, hooks, **cfg).run(backends(n), attempt))
    assert ran == tried
    assert (failed.reason if failed else None) == last
    assert [f[0] for f in hooks.failed] == [u for u in tried if outcomes.get(u)]
    assert [f[2] for f in hooks.failed] == list(range(1, len(hooks.failed) + 1))
    # A retry is counted when the next attempt starts, not for the last failure
    assert hooks.retried == [(u, outcomes[u]) for u in tried[:-1]]


def _mixed(roles: str) -> list[Backend]:
    return [Backend(f"http://{r}{i}", r, Role.LATENCY if r == "l" else Role.THROUGHPUT,
                    frozenset({"m"})) for i, r in enumerate(roles)]  # fmt: skip


@pytest.mark.parametrize(
    ("roles", "limit", "kept"),
    [
        ("ttttl", 3, "ttl"),  # the other tier keeps the last place
        ("tttlt", 3, "ttl"),
        ("ttlt", 3, "ttl"),  # already there
        ("tttt", 3, "ttt"),  # no other tier
        ("ltttt", 2, "lt"),
        ("tl", 3, "tl"),
        ("ttttl", 1, "t"),  # one attempt: the policy's first choice, nothing else
    ],
)
def test_the_attempts_keep_a_candidate_of_each_tier(roles: str, limit: int, kept: str) -> None:
    assert "".join(b.tier for b in within(_mixed(roles), limit)) == kept


def test_no_candidate_is_a_failure_not_a_success() -> None:
    clock, hooks = Clock(), Hooks()
    _, attempt = script(clock, {})
    failed = asyncio.run(executor(clock, hooks).run([], attempt))
    assert failed is not None
    assert failed.reason == "no_candidate"


def test_backoff_doubles_from_the_initial_wait_with_jitter_and_a_cap() -> None:
    clock, hooks = Clock(), Hooks()
    ex = executor(clock, hooks, max_attempts=6, backoff_initial_s=0.1, backoff_max_s=0.5)
    _, attempt = script(clock, {f"http://b{i}": "x" for i in range(6)})
    asyncio.run(ex.run(backends(6), attempt))
    assert len(clock.slept) == 5
    for wait, base in zip(clock.slept, [0.1, 0.2, 0.4, 0.5, 0.5], strict=True):
        assert base <= wait <= base + 0.1
    # The jitter is real: not every wait sits on its base.
    assert any(w - b > 1e-6 for w, b in zip(clock.slept, [0.1, 0.2, 0.4, 0.5, 0.5], strict=True))


def test_no_attempt_starts_after_the_deadline() -> None:
    clock, hooks = Clock(), Hooks()
    ex = executor(clock, hooks, max_attempts=10, deadline_s=3.0, backoff_initial_s=0.01)
    # Each attempt takes a second: the third would start past 3 s (2 s + backoff is fine,
    # 3 s + backoff is not).
    tried, attempt = script(clock, {f"http://b{i}": "timeout" for i in range(10)}, cost=1.0)
    failed = asyncio.run(ex.run(backends(10), attempt))
    assert len(tried) == 3
    assert failed is not None
    assert failed.reason == "timeout"


def test_an_empty_budget_stops_retries_and_says_so() -> None:
    clock, hooks = Clock(), Hooks()
    ex = executor(clock, hooks, budget_ratio=0.0, budget_min_per_s=0.0)
    ex.budget.tokens = 1.0  # one retry left, then none
    outcomes = {f"http://b{i}": "x" for i in range(3)}
    tried, attempt = script(clock, outcomes)
    asyncio.run(ex.run(backends(3), attempt))
    assert len(tried) == 2
    assert hooks.exhausted == 1
    tried.clear()
    asyncio.run(ex.run(backends(3), attempt))
    assert tried == ["http://b0"]
    assert hooks.exhausted == 2


def test_retryable_statuses_come_from_the_config() -> None:
    ex = RetryExecutor(RetryConfig(retry_statuses=[429, 503]), Hooks())
    assert [s for s in (200, 400, 429, 500, 502, 503) if ex.retryable(s)] == [429, 503]


# -- the budget ---------------------------------------------------------------------------------


def test_budget_allows_a_ratio_of_requests_plus_a_rate() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=0.2, min_per_s=1.0, clock=clock)
    assert budget.cap == 10.0
    spent = sum(budget.try_spend() for _ in range(50))
    assert spent == 10  # starts full, at its cap
    assert not budget.try_spend()
    for _ in range(12):  # 0.2 of a retry per request: twelve earn two
        budget.on_request()
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]
    clock.now += 3.0  # and time earns min_per_s a second
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]


def test_budget_never_exceeds_its_cap() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=1.0, min_per_s=5.0, clock=clock)
    for _ in range(1000):
        budget.on_request()
    clock.now += 3600
    assert budget.cap == 50.0
    assert sum(budget.try_spend() for _ in range(100)) == 50
