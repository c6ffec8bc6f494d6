"""The latency tier's hard cap checked again as a lease is taken (several workers: another may
take the last slot between a decision and its lease), and a full candidate passed over without
counting as a failure."""

from __future__ import annotations

import asyncio
import random

from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import RetryConfig, Settings
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.retry import Full, Retryable, RetryExecutor
from gateway.routing import Backend, Role

LAT, THR = "http://lat:1", "http://thr:1"
CAP = 2


def registry(workers: int) -> Registry:
    settings = Settings(
        tiers=[
            {"name": "eagle", "role": "latency", "backends": [{"url": LAT, "models": ["m"]}]},
            {"name": "awq", "role": "throughput", "backends": [{"url": THR, "models": ["m"]}]},
        ],
        policy={"latency_max_concurrency": CAP, "hysteresis": 1, "latency_hard_cap": CAP},
        workers=workers,
    )
    return Registry(settings, MemoryInflightStore(), Telemetry(), lambda: 100.0)


async def test_a_lease_on_a_slot_another_worker_took_is_not_held() -> None:
    reg = registry(workers=2)
    reg.store.acquire(LAT)
    reg.snapshot()  # routing sees room: 1 of 2
    reg.store.acquire(LAT)  # another worker takes the last slot before the lease
    with reg.lease(reg.entry(LAT)) as lease:
        assert not lease.held
        assert reg.store.counts() == {LAT: 2}  # nothing counted
        assert reg.entry(LAT).busy == 0
    assert reg.store.counts() == {LAT: 2}  # and nothing given back
    reg.store.release(LAT)
    with reg.lease(reg.entry(LAT)) as lease:
        assert lease.held
        assert reg.store.counts() == {LAT: 2}
    assert reg.store.counts() == {LAT: 1}


async def test_a_policy_that_knowingly_goes_past_the_cap_is_not_second_guessed() -> None:
    reg = registry(workers=2)
    for _ in range(CAP):
        reg.store.acquire(LAT)
    reg.snapshot()  # routing saw the cap reached, and chose the backend anyway (a baseline)
    with reg.lease(reg.entry(LAT)) as lease:
        assert lease.held
        assert reg.store.counts() == {LAT: CAP + 1}


async def test_throughput_backends_and_a_single_worker_are_never_capped() -> None:
    for reg, url in ((registry(workers=2), THR), (registry(workers=1), LAT)):
        reg.snapshot()
        for _ in range(CAP):
            reg.store.acquire(url)
        with reg.lease(reg.entry(url)) as lease:
            assert lease.held
            assert reg.store.counts() == {url: CAP + 1}


class Hooks:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def attempt_failed(self, backend: Backend, error: Retryable, attempt: int) -> None:
        self.calls.append(f"failed {backend.url} {error.reason}")

    def retrying(self, failed: Backend, error: Retryable) -> None:
        self.calls.append(f"retrying {failed.url}")

    def budget_exhausted(self) -> None:
        self.calls.append("exhausted")


def test_a_full_candidate_is_passed_over_at_once_and_reported_nowhere() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    hooks = Hooks()
    retry = RetryExecutor(RetryConfig(), hooks, clock=lambda: 0.0, sleep=sleep,
                          rng=random.Random(1))  # fmt: skip
    lat = Backend(LAT, "eagle", Role.LATENCY, frozenset({"m"}))
    thr = Backend(THR, "awq", Role.THROUGHPUT, frozenset({"m"}))
    tried: list[str] = []
    outcomes: dict[str, Retryable | None] = {LAT: Full(), THR: None}

    async def attempt(b: Backend) -> None:
        tried.append(b.url)
        if (error := outcomes[b.url]) is not None:
            raise error

    tokens = retry.budget.tokens
    assert asyncio.run(retry.run([lat, thr], attempt)) is None
    assert tried == [LAT, THR]
    assert (slept, hooks.calls) == ([], [])  # no backoff, no retry, no failure reported
    assert retry.budget.tokens >= tokens  # nothing spent

    # Every candidate full: the request goes back to admission.
    outcomes[THR] = Full()
    assert isinstance(asyncio.run(retry.run([lat, thr], attempt)), Full)
    # A real failure first: that failure is the answer, not the full one after it.
    outcomes[LAT], outcomes[THR] = Retryable("http_503", 503), Full()
    last = asyncio.run(retry.run([lat, thr], attempt))
    assert last is not None
    assert last.reason == "http_503"
