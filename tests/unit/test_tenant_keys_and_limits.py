"""Tenants (pipeline.tenants) and their limits counted in process (pipeline.limits), on a
virtual clock."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest

from gateway.config.settings import LimitsConfig, Settings
from gateway.pipeline import tenants as tenants_module
from gateway.pipeline.limits import (
    LocalLimits,
    Verdict,
    duration,
    total_tokens,
)
from gateway.pipeline.tenants import ANONYMOUS, Tenant, Tenants, hash_key, new_key
from gateway.pipeline.usage import without_usage_events

KEYS = {"alice": "sk-alice-key", "bob": "sk-bob-key"}


def settings(**extra: Any) -> Settings:
    tenants = [{"name": n, "key_sha256": hash_key(k), "priority": "interactive"}
               for n, k in KEYS.items()]  # fmt: skip
    return Settings(tenants=tenants, **extra)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"Bearer sk-alice-key", "alice"),
        (b"bearer sk-bob-key", "bob"),  # the scheme is case-insensitive
        (b"Bearer  sk-bob-key ", "bob"),
        (b"Bearer sk-alice-kez", None),
        (b"sk-alice-key", None),  # no scheme
        (b"Basic sk-alice-key", None),
        (b"Bearer ", None),
        (b"", None),
        (None, None),
        (b"Bearer " + hash_key("sk-alice-key").encode(), None),  # the hash is not the key
    ],
)
def test_identify(header: bytes | None, expected: str | None) -> None:
    found = Tenants(settings()).identify(header)
    assert (found.name if found else None) == expected


def test_plain_api_keys_are_the_default_tenant() -> None:
    t = Tenants(settings(api_keys=["plain-key"]))
    found = t.identify(b"Bearer plain-key")
    assert found is not None
    assert found.name == "default"
    assert t.identify(b"Bearer sk-alice-key") is not None


def test_no_keys_configured_is_anonymous() -> None:
    assert Tenants(Settings()).identify(None) is ANONYMOUS


def test_a_wrong_key_takes_the_same_steps_as_a_right_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """By construction: one SHA-256 of the presented key, one dict probe, one constant-time
    comparison, whether the key is right or wrong."""
    calls: list[str] = []
    real_sha, real_compare = hashlib.sha256, hmac.compare_digest

    def sha(data: bytes = b"") -> Any:
        calls.append("sha256")
        return real_sha(data)

    def compare(a: bytes, b: bytes) -> bool:
        calls.append(f"compare:{len(a)}:{len(b)}")
        return real_compare(a, b)

    t = Tenants(settings())
    monkeypatch.setattr(tenants_module.hashlib, "sha256", sha)
    monkeypatch.setattr(tenants_module.hmac, "compare_digest", compare)
    steps = []
    for header in (b"Bearer sk-alice-key", b"Bearer wrong", b"Bearer sk-alice-kez", None):
        calls.clear()
        t.identify(header)
        steps.append(list(calls))
    assert all(s == ["sha256", "compare:32:32"] for s in steps), steps


def test_new_keys_are_random_and_long() -> None:
    a, b = new_key(), new_key()
    assert a != b
    assert a.startswith("sk-")
    assert len(a) > 40


def tenant(**limits: int) -> Tenant:
    return Tenant("t", 1, LimitsConfig(**limits), frozenset(), None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_is_a_sliding_window() -> None:
    clock = Clock()
    lim, t = LocalLimits(clock), tenant(requests_per_minute=3)
    got = []
    for at in (0, 10, 20, 30, 59.9, 60.0, 60.5, 70, 79, 80.0, 130):
        clock.now = 1000 + at
        v = lim.admit(t)
        got.append(v.allowed)
        if v.allowed:
            lim.release(t)
    # 3 in any 60 s: the 4th waits until the 1st is 60 s old, and so on.
    assert got == [True, True, True, False, False, True, False, True, False, True, True]


def test_refusal_says_when_to_retry_and_what_is_left() -> None:
    clock = Clock()
    lim, t = LocalLimits(clock), tenant(requests_per_minute=2)
    first = lim.admit(t)
    assert first.requests is not None
    assert (first.requests.limit, first.requests.remaining) == (2, 1)
    clock.now += 15
    lim.admit(t)
    clock.now += 5
    refused = lim.admit(t)
    assert not refused.allowed
    assert refused.refused_by == "requests"
    assert refused.retry_after_s == pytest.approx(40)  # the first start leaves the window
    assert refused.requests is not None
    assert refused.requests.remaining == 0
    err = refused.error(t)
    assert err.status == 429
    headers = dict(err.headers)
    assert headers[b"retry-after"] == b"40"
    assert headers[b"x-ratelimit-limit-requests"] == b"2"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-reset-requests"] == b"55s"  # the newest start's leaving


def test_tokens_per_minute_charge_real_usage() -> None:
    clock = Clock()
    lim, t = LocalLimits(clock), tenant(tokens_per_minute=600)
    assert lim.admit(t).allowed
    lim.charge(t, 500)
    v = lim.admit(t)
    assert v.allowed
    assert v.tokens is not None
    assert v.tokens.remaining == 100
    lim.charge(t, 400)  # below zero: the next waits for the refill (10 tokens/s)
    refused = lim.admit(t)
    assert not refused.allowed
    assert refused.refused_by == "tokens"
    assert refused.retry_after_s == pytest.approx(30.1)  # from -300 to +1 at 10/s
    clock.now += 31
    assert lim.admit(t).allowed
    clock.now += 1000
    v = lim.admit(t)
    assert v.tokens is not None
    assert v.tokens.remaining == 600  # never above the bucket


def test_max_concurrent_counts_requests_in_flight() -> None:
    lim, t = LocalLimits(Clock()), tenant(max_concurrent=2)
    assert lim.admit(t).allowed
    assert lim.admit(t).allowed
    refused = lim.admit(t)
    assert refused.refused_by == "concurrency"
    lim.release(t)
    assert lim.admit(t).allowed


def test_a_refused_request_takes_nothing() -> None:
    clock = Clock()
    lim, t = LocalLimits(clock), tenant(requests_per_minute=1, max_concurrent=1)
    assert lim.admit(t).allowed
    assert lim.admit(t).refused_by == "concurrency"
    lim.release(t)
    assert lim.admit(t).refused_by == "requests"
    assert lim.usage_of(t).inflight == 0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0ms"), (0.0201, "21ms"), (1.0, "1s"), (59.2, "1m0s"), (360, "6m0s"), (61, "1m1s")],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("body", "total"),
    [
        (b'{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}', 12),
        (b'{"usage": {"total_tokens": 40}}', 40),
        (b'data: {"choices":[],"usage":{"total_tokens":3}}\n\ndata: [DONE]\n\n', 3),
        (b'data: {"choices":[{"text":"hi"}]}\n\n', None),
        (b'{"total_tokens":}', None),
    ],
)
def test_total_tokens(body: bytes, total: int | None) -> None:
    assert total_tokens(body) == total


def test_usage_events_are_taken_out() -> None:
    body = (b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[],"usage":{"total_tokens":'
            b'3}}\n\ndata: [DONE]\n\n')  # fmt: skip
    assert without_usage_events(body) == b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n'
    assert without_usage_events(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"


_TEXT = b'data: {"choices":[{"text":"a"}]}'
_USAGE = b'data: {"choices":[],"usage":{"total_tokens":3}}'
# An engine writing its JSON with spaces (json.dumps' defaults, and more): every event alike.
_TEXT_SPACED = b'data: {"choices": [{"text": "a"}]}'
_SPACED = b'data: {"choices" : [ ], "usage": {"total_tokens": 3}}'


@pytest.mark.parametrize(
    "events",
    [
        [_USAGE], [_USAGE, b"data: [DONE]"], [_TEXT, _USAGE], [_USAGE, _TEXT, _USAGE],
        [_TEXT, _USAGE, _USAGE, _TEXT], [_TEXT, _TEXT], [], [b": a comment", _USAGE, _TEXT],
        [_SPACED], [_TEXT_SPACED, _SPACED], [_SPACED, _TEXT_SPACED, _SPACED],
        [_TEXT_SPACED, _SPACED, _SPACED], [_TEXT_SPACED, _TEXT_SPACED],
    ],
)  # fmt: skip
@pytest.mark.parametrize("terminated", [True, False])
def test_usage_events_are_cut_as_splitting_into_events_would(
    events: list[bytes], terminated: bool
) -> None:
    body = b"\n\n".join(events) + (b"\n\n" if terminated and events else b"")
    usage_only = (_USAGE, _SPACED)
    split = b"\n\n".join(e for e in body.split(b"\n\n") if e not in usage_only)
    assert without_usage_events(body) == split


def test_verdict_headers_only_for_the_limits_set() -> None:
    assert Verdict(True).headers() == []
