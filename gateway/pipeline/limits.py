"""Tenants' limits: requests per minute, tokens per minute, requests in flight.

- Requests per minute: a sliding log of the request starts of the last 60 s, so no 60 s window
  ever holds more than the limit (a fixed per-minute window lets twice through across its edge;
  a token bucket full at the start lets a minute's worth through at once and then the next).
- Tokens per minute: a bucket of `tokens_per_minute`, refilled at that rate per minute, charged
  with each answer's usage (prompt + completion tokens) when the answer ends; a request goes
  while the bucket is above zero, so one long answer can take it below zero and the next wait.
- Requests in flight: counted per gateway process.

With Redis (`redis_url`) the first two are shared by every replica: one Lua script per
request checks both and takes a slot atomically, on Redis's clock, and another charges tokens.
When Redis does not answer within 500 ms the gateway counts locally instead (each replica
then allows the whole limit on its own), logs the change and shows it in
`tiergate_limits_degraded`; never an error, never no limits.

The answers carry OpenAI's rate-limit headers: x-ratelimit-limit-, -remaining- and -reset-
(-requests and -tokens), and a refusal is a 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.config.settings import TenantConfig
from gateway.core.errors import GatewayError
from gateway.core.exchange import Caller, Exchange
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.tenants import ANONYMOUS

__all__ = ["Limits", "LocalLimits", "Quota", "RedisLimits", "Verdict", "duration"]

log = logging.getLogger(__name__)

WINDOW_S = 60.0
# Longest wait for Redis on a request's path before counting locally: Redis answers in about a
# millisecond; a slow answer is an outage for the request waiting on it.
_REDIS_TIMEOUT_S = 0.5


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: 1s, 6m0s, 20ms."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    s = math.ceil(seconds)
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


@dataclass(frozen=True, slots=True)
class Quota:
    limit: int
    remaining: int
    reset_s: float  # until the quota is whole again


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    requests: Quota | None = None
    tokens: Quota | None = None
    refused_by: str = ""  # requests, tokens or concurrency
    retry_after_s: float = 0.0

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = []
        for kind, q in (("requests", self.requests), ("tokens", self.tokens)):
            if q is not None:
                out += [
                    (f"x-ratelimit-limit-{kind}".encode(), str(q.limit).encode()),
                    (f"x-ratelimit-remaining-{kind}".encode(), str(q.remaining).encode()),
                    (f"x-ratelimit-reset-{kind}".encode(), duration(q.reset_s).encode()),
                ]
        return out

    def error(self, tenant: Caller) -> GatewayError:
        what = {"requests": "requests per minute", "tokens": "tokens per minute",
                "concurrency": "requests in flight"}[self.refused_by]  # fmt: skip
        retry = max(1, math.ceil(self.retry_after_s))
        return GatewayError(
            429, f"Rate limit reached for {what} of key `{tenant.name}`; retry in {retry} s.",
            headers=[(b"retry-after", str(retry).encode()), *self.headers()],
            reason="rate_limited",
        )  # fmt: skip


@dataclass(slots=True)
class _Usage:
    starts: deque[float] = field(default_factory=deque)
    level: float | None = None  # tokens left in the bucket (None: full, not yet used)
    level_at: float = 0.0
    inflight: int = 0


class LocalLimits:
    """The limits as one process counts them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.usage: dict[str, _Usage] = {}

    def usage_of(self, tenant: Caller) -> _Usage:
        u = self.usage.get(tenant.name)
        if u is None:
            u = self.usage[tenant.name] = _Usage()
        return u

    def admit(self, tenant: Caller) -> Verdict:
        """Take a request slot (and a place in flight), or say why not."""
        lim, u, now = tenant.limits, self.usage_of(tenant), self.clock()
        starts = u.starts
        while starts and starts[0] <= now - WINDOW_S:
            starts.popleft()
        tokens = None
        if lim.tokens_per_minute:
            level = self._level(u, lim.tokens_per_minute, now)
            tokens = _bucket_quota(level, lim.tokens_per_minute)
            if level <= 0:
                wait = (1 - level) * WINDOW_S / lim.tokens_per_minute
                return Verdict(False, _log_quota(u.starts, lim.requests_per_minute, now),
                               tokens, "tokens", wait)  # fmt: skip
        if lim.max_concurrent and u.inflight >= lim.max_concurrent:
            return Verdict(False, None, tokens, "concurrency", 1.0)
        requests = None
        if lim.requests_per_minute:
            if len(starts) >= lim.requests_per_minute:
                wait = starts[0] + WINDOW_S - now
                return Verdict(False, _log_quota(starts, lim.requests_per_minute, now), tokens,
                               "requests", wait)  # fmt: skip
            starts.append(now)
            requests = _log_quota(starts, lim.requests_per_minute, now)
        u.inflight += 1
        return Verdict(True, requests, tokens)

    def charge(self, tenant: Caller, tokens: int) -> None:
        tpm = tenant.limits.tokens_per_minute
        if tpm and tokens > 0:
            u, now = self.usage_of(tenant), self.clock()
            u.level = self._level(u, tpm, now) - tokens

    def release(self, tenant: Caller) -> None:
        u = self.usage.get(tenant.name)
        if u is not None and u.inflight > 0:
            u.inflight -= 1

    @staticmethod
    def _level(u: _Usage, tpm: int, now: float) -> float:
        level = tpm if u.level is None else min(tpm, u.level + (now - u.level_at) * tpm / WINDOW_S)
        u.level, u.level_at = level, now
        return level


def _log_quota(starts: deque[float], limit: int | None, now: float) -> Quota | None:
    if not limit:
        return None
    reset = starts[-1] + WINDOW_S - now if starts else 0.0  # the newest start's leaving
    return Quota(limit, max(0, limit - len(starts)), reset)


def _bucket_quota(level: float, tpm: int) -> Quota:
    return Quota(tpm, max(0, math.floor(level)), (tpm - level) * WINDOW_S / tpm)


# KEYS: the tenant's request log (a sorted set) and token bucket (a hash).
# ARGV: window in ms, requests per minute (0: none), tokens per minute (0: none), a unique member.
# Returns {allowed, refused_by, requests in the window, oldest start (ms), newest start (ms),
# bucket level} on Redis's own clock, numbers as strings (Lua numbers would be truncated).
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local win, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local level = -1
if tpm > 0 then
  local h = redis.call('HMGET', KEYS[2], 'level', 'at')
  local lv, at = tonumber(h[1]) or tpm, tonumber(h[2]) or now
  level = math.min(tpm, lv + (now - at) * tpm / win)
  redis.call('HSET', KEYS[2], 'level', tostring(level), 'at', tostring(now))
  redis.call('PEXPIRE', KEYS[2], win * 2)
end
local count, oldest, newest = 0, now, now
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - win)
  count = redis.call('ZCARD', KEYS[1])
  if count > 0 then
    oldest = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
    newest = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
  end
end
local function out(ok, why)
  return {ok, why, tostring(count), tostring(oldest), tostring(newest), tostring(level),
          tostring(now)}
end
if tpm > 0 and level <= 0 then return out('0', 'tokens') end
if rpm > 0 then
  if count >= rpm then return out('0', 'requests') end
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], win)
  count, newest = count + 1, now
end
return out('1', '')
"""
# KEYS: the token bucket. ARGV: window in ms, tokens per minute, tokens to charge.
_CHARGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local win, tpm, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 'level', 'at')
local lv, at = tonumber(h[1]) or tpm, tonumber(h[2]) or now
local level = math.min(tpm, lv + (now - at) * tpm / win) - n
redis.call('HSET', KEYS[1], 'level', tostring(level), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], win * 2)
return tostring(level)
"""


class RedisLimits:
    """The per-minute limits shared through Redis, local counting when it fails, and the
    in-flight limit per process (module docstring)."""

    def __init__(self, url: str, local: LocalLimits, on_degraded: Callable[[bool], None],
                 key_prefix: str = "tiergate") -> None:  # fmt: skip
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.local, self.on_degraded, self.prefix = local, on_degraded, key_prefix
        self.client: Any = Redis.from_url(
            url, decode_responses=True, socket_timeout=_REDIS_TIMEOUT_S,
            socket_connect_timeout=_REDIS_TIMEOUT_S, retry=Retry(NoBackoff(), 0),
        )  # fmt: skip
        self.admit_script = self.client.register_script(_ADMIT)
        self.charge_script = self.client.register_script(_CHARGE)
        self.degraded = False
        self._ids = itertools.count()
        self._me = f"{os.getpid()}-{secrets.token_hex(4)}"

    async def start(self) -> None:
        """Connect and load the scripts now, so that the first request does not pay for it
        (and, on a busy host, run past the timeout); Redis down at start is not an error."""
        try:
            async with asyncio.timeout(2.0):
                await self.client.script_load(_ADMIT)
                await self.client.script_load(_CHARGE)
        except Exception as e:
            self._degrade(e)

    async def admit(self, tenant: Caller) -> Verdict:
        lim = tenant.limits
        if not (lim.requests_per_minute or lim.tokens_per_minute):
            return self.local.admit(tenant)
        if lim.max_concurrent and self.local.usage_of(tenant).inflight >= lim.max_concurrent:
            return Verdict(False, None, None, "concurrency", 1.0)
        keys = (f"{self.prefix}:limits:{tenant.name}:requests",
                f"{self.prefix}:limits:{tenant.name}:tokens")  # fmt: skip
        args = (int(WINDOW_S * 1000), lim.requests_per_minute or 0, lim.tokens_per_minute or 0,
                f"{self._me}-{next(self._ids)}")  # fmt: skip
        try:
            async with asyncio.timeout(_REDIS_TIMEOUT_S):
                got = await self.admit_script(keys=keys, args=args)
        except Exception as e:  # any failure of Redis: count locally, never fail the request
            self._degrade(e)
            return self.local.admit(tenant)
        self._recovered()
        verdict = _verdict(got, lim.requests_per_minute, lim.tokens_per_minute)
        if verdict.allowed:
            self.local.usage_of(tenant).inflight += 1
        return verdict

    async def charge(self, tenant: Caller, tokens: int) -> None:
        tpm = tenant.limits.tokens_per_minute
        if not tpm or tokens <= 0:
            return
        key = f"{self.prefix}:limits:{tenant.name}:tokens"
        try:
            async with asyncio.timeout(_REDIS_TIMEOUT_S):
                await self.charge_script(keys=(key,), args=(int(WINDOW_S * 1000), tpm, tokens))
        except Exception as e:
            self._degrade(e)
            self.local.charge(tenant, tokens)

    def release(self, tenant: Caller) -> None:
        self.local.release(tenant)

    async def aclose(self) -> None:
        await self.client.aclose()

    def _degrade(self, e: BaseException) -> None:
        if not self.degraded:
            self.degraded = True
            log.warning("Redis unreachable: rate limits counted per gateway process until it "
                        "answers again", extra={"fields": {"error": repr(e)}})  # fmt: skip
            self.on_degraded(True)

    def _recovered(self) -> None:
        if self.degraded:
            self.degraded = False
            log.info("Redis answers again: rate limits shared again")
            self.on_degraded(False)


def _verdict(got: list[str], rpm: int | None, tpm: int | None) -> Verdict:
    ok, why, count, oldest, newest, level, now = got
    n, t0, t1, lv, t = int(count), float(oldest), float(newest), float(level), float(now)
    requests = (Quota(rpm, max(0, rpm - n), max(0.0, (t1 + WINDOW_S * 1000 - t) / 1000))
                if rpm else None)  # fmt: skip
    tokens = _bucket_quota(lv, tpm) if tpm else None
    if ok == "1":
        return Verdict(True, requests, tokens)
    if why == "tokens":
        assert tpm
        return Verdict(False, requests, tokens, why, (1 - lv) * WINDOW_S / tpm)
    return Verdict(False, requests, tokens, why, max(0.0, (t0 + WINDOW_S * 1000 - t) / 1000))


_TOTAL = b'"total_tokens":'


def total_tokens(body: bytes) -> int | None:
    """The last usage's `total_tokens` in `body` (OpenAI JSON or SSE)."""
    i = body.rfind(_TOTAL)
    if i == -1:
        return None
    j = i + len(_TOTAL)
    digits = body[j : j + 24].lstrip(b" ")
    end = 0
    while end < len(digits) and digits[end : end + 1].isdigit():
        end += 1
    return int(digits[:end]) if end else None


class Limits:
    """The tenants' limits on the request path: `admit` after intake, `finish` when the request
    is over, whatever its end. Nothing happens for a tenant without limits."""

    def __init__(
        self, redis_url: str | None, telemetry: Telemetry, tenants: Iterable[TenantConfig] = ()
    ) -> None:
        self.telemetry = telemetry
        kinds = (("requests", "requests_per_minute"), ("tokens", "tokens_per_minute"),
                 ("concurrency", "max_concurrent"))  # fmt: skip
        telemetry.declare_tenants(
            (t.name, [k for k, field in kinds if getattr(t.limits, field)]) for t in tenants
        )
        self.local = LocalLimits()
        self.shared = (None if redis_url is None else RedisLimits(
            redis_url, self.local, lambda on: telemetry.limits_degraded.set(int(on))))  # fmt: skip
        self.charges: set[asyncio.Task[None]] = set()

    async def admit(self, ex: Exchange) -> None:
        """Take the request's slot, or a GatewayError (429)."""
        tenant = ex.tenant
        if tenant is None or tenant is ANONYMOUS:
            return
        if not tenant.limited:  # its usage is still counted
            ex.limited = True
            _watch(ex, [])
            return
        verdict = (self.local.admit(tenant) if self.shared is None
                   else await self.shared.admit(tenant))  # fmt: skip
        if not verdict.allowed:
            t = self.telemetry
            t.child(t.rate_limited, tenant.name, verdict.refused_by).inc()
            raise verdict.error(tenant)
        ex.limited = True
        _watch(ex, verdict.headers())

    def finish(self, ex: Exchange) -> None:
        """The request is over: its place in flight back, its tokens charged."""
        tenant = ex.tenant
        if not ex.limited or tenant is None:
            return
        ex.limited = False
        if self.shared is None:
            self.local.release(tenant)
            self.local.charge(tenant, ex.usage_tokens)
            return
        self.shared.release(tenant)
        if ex.usage_tokens and tenant.limits.tokens_per_minute:
            task = asyncio.get_running_loop().create_task(
                self.shared.charge(tenant, ex.usage_tokens)
            )
            self.charges.add(task)
            task.add_done_callback(self.charges.discard)

    async def start(self) -> None:
        if self.shared is not None:
            await self.shared.start()

    async def aclose(self) -> None:
        if self.charges:
            await asyncio.wait(list(self.charges), timeout=1)
        if self.shared is not None:
            await self.shared.aclose()


def _watch(ex: Exchange, headers: list[tuple[bytes, bytes]]) -> None:
    """The rate-limit headers go on the answer, whoever gives it, and the answer's usage is
    read as it passes (the first of its body's filters: every stream carries usage,
    gateway.pipeline.usage asks for it where the client did not, and takes it out of what
    that client gets, after this)."""

    def read_usage(body: bytes) -> bytes:
        if (n := total_tokens(body)) is not None:
            ex.usage_tokens = n
        return body

    ex.body_filters.insert(0, read_usage)
    ex.added_headers += headers
