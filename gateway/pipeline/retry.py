"""Retries before the first byte: which failures are retried, the backoff between attempts,
the total deadline, and the retry budget that keeps a failing backend from multiplying the load
on the others.

Nothing reaches the client until an engine has produced its first body bytes, so until then any
failure can move to the next candidate. The attempt itself (upstream.py) says what failed by
raising `Retryable`; this module decides whether and when to try the next one.

Hand-written rather than tenacity: tenacity takes its time from `time.monotonic` itself, so its
deadline cannot run on a test's virtual clock, and building its retry state for each request cost
a measurable share of the gateway's CPU when every request went through it; the loop below is
the part of it the gateway used, with the clock, sleep and randomness passed in.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gateway.config.settings import RetryConfig
from gateway.routing import Backend

__all__ = ["Displaced", "Full", "Gone", "RetryBudget", "RetryExecutor", "RetryHooks", "Retryable"]


class Retryable(Exception):
    """An attempt failed before any byte reached the client. `reason` is a metric label,
    `detail` what went wrong in words (for the client's 502, should it be the last); an
    engine's refusal keeps its status, body and Retry-After for the client, should it be the
    last."""

    def __init__(
        self,
        reason: str,
        status: int | None = None,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        detail: str = "",
    ) -> None:
        super().__init__(reason)
        self.reason, self.status, self.body, self.headers = reason, status, body, headers or []
        self.detail = detail


class Full(Retryable):
    """The candidate was passed over, not tried: a capped backend had no room left when the
    attempt came to take it (another gateway worker took its last slot after this request's
    decision). Not a failure: no backoff, no retry budget, no report against the backend."""

    def __init__(self) -> None:
        super().__init__("full")


class Gone(Full):
    """The candidate left the pool (discovery lost it) after the decision: passed over like a
    full one; the request is routed again if no other candidate answers."""

    def __init__(self) -> None:
        Retryable.__init__(self, "gone")


class Displaced(Full):
    """The attempt gave its place, before its first byte, to a request of a higher priority
    (gateway.backends.registry.Registry.displace): the request goes back to admission, where it
    waits behind that one, instead of trying the next candidate (as full as this one)."""

    def __init__(self) -> None:
        Retryable.__init__(self, "displaced")


class RetryBudget:
    """Retries allowed: `ratio` of recent requests plus `min_per_s`, so that a failing backend
    cannot multiply the load on the others (a token bucket refilled by requests and by time)."""

    def __init__(self, ratio: float, min_per_s: float, clock: Callable[[], float]) -> None:
        self.ratio, self.min_per_s, self.clock = ratio, min_per_s, clock
        self.cap = max(10.0, min_per_s * 10)
        self.tokens = self.cap
        self.at = clock()

    def on_request(self) -> None:
        self.tokens = min(self.cap, self.tokens + self.ratio)

    def try_spend(self) -> bool:
        now = self.clock()
        self.tokens = min(self.cap, self.tokens + (now - self.at) * self.min_per_s)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class RetryHooks(Protocol):
    """What the executor reports (metrics, logs)."""

    def attempt_failed(self, backend: Backend, error: Retryable, attempt: int) -> None: ...

    def retrying(self, failed: Backend, error: Retryable) -> None: ...

    def budget_exhausted(self) -> None: ...


class RetryExecutor:
    def __init__(
        self,
        cfg: RetryConfig,
        hooks: RetryHooks,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg, self.hooks, self.clock, self.sleep = cfg, hooks, clock, sleep
        self.rng = rng or random.Random()
        self.budget = RetryBudget(cfg.budget_ratio, cfg.budget_min_per_s, clock)
        self.statuses = frozenset(cfg.retry_statuses)

    def retryable(self, status: int) -> bool:
        """An engine answer that means "try elsewhere"."""
        return status in self.statuses

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt` (2, 3, ...): exponential from
        `backoff_initial_s`, capped at `backoff_max_s`, plus up to `backoff_initial_s` of
        jitter so that retries of many requests do not arrive together."""
        initial = self.cfg.backoff_initial_s
        base = min(initial * 2.0 ** (attempt - 2), self.cfg.backoff_max_s)
        return base + self.rng.uniform(0, initial)

    async def run(
        self, candidates: Sequence[Backend], attempt: Callable[[Backend], Awaitable[None]]
    ) -> Retryable | None:
        """Try the candidates in order until an attempt succeeds (None) or no retry is left
        (the last failure; `Full` when every candidate tried was full). At most
        `max_attempts`, none started after `deadline_s`, and each retry spends from the budget.
        """
        self.budget.on_request()
        started = self.clock()
        last: Retryable | None = None  # (made only where needed: an exception is two calls)
        previous: Backend | None = None
        for n, backend in enumerate(within(candidates, self.cfg.max_attempts), 1):
            if previous is not None:
                wait = self.backoff(n)
                if self.clock() - started + wait >= self.cfg.deadline_s:
                    break
                if not self.budget.try_spend():
                    self.hooks.budget_exhausted()
                    break
                assert last is not None  # set with `previous`
                self.hooks.retrying(previous, last)
                await self.sleep(wait)
            try:
                await attempt(backend)
                return None
            except Displaced as e:
                return e
            except Full as e:
                if previous is None:
                    last = e
            except Retryable as e:
                self.hooks.attempt_failed(backend, e, n)
                last, previous = e, backend
        return last or Retryable("no_candidate")


def within(candidates: Sequence[Backend], limit: int) -> Sequence[Backend]:
    """The first `limit` candidates, keeping one of each role among them if the candidates
    have one: the last place goes to the first of a role missing, so a whole tier failing
    still leaves the other tier a try (with two attempts or more: one is the policy's)."""
    if len(candidates) <= limit or limit < 2:
        return candidates[:limit]
    head = list(candidates[:limit])
    roles = {b.role for b in head}
    for b in candidates[limit:]:
        if b.role not in roles:
            head[-1] = b
            break
    return head
