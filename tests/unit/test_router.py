"""The router around the policy: a policy that fails does not fail the request."""

from __future__ import annotations

import logging
import random

import pytest

from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.router import Router
from gateway.routing import Decision, LoadSnapshot, Reason, RouteRequest, RouterState


class _Broken:
    name = "learned"

    def __call__(self, req: RouteRequest, snap: LoadSnapshot, state: RouterState,
                 rng: random.Random) -> Decision:  # fmt: skip
        raise ZeroDivisionError("a policy bug")


def test_a_failing_policy_falls_back_to_the_least_loaded(caplog: pytest.LogCaptureFixture) -> None:
    tiers = [{"name": "l", "role": "latency", "backends": [{"url": "http://l:1", "models": ["m"]}]},
             {"name": "t", "role": "throughput",
              "backends": [{"url": "http://t1:1", "models": ["m"]},
                           {"url": "http://t2:1", "models": ["m"]}]}]  # fmt: skip
    settings = Settings(tiers=tiers)
    reg = Registry(settings, MemoryInflightStore(), Telemetry())
    router = Router(settings.policy, reg)
    router.policy = _Broken()  # type: ignore[assignment]
    for url in ("http://l:1", "http://t1:1"):
        reg.store.acquire(url)  # t2 is the least loaded
    with caplog.at_level(logging.ERROR, logger="gateway.pipeline.router"):
        decisions = [router.decide(RouteRequest("m")) for _ in range(3)]
    for d in decisions:
        assert d.reason == Reason.POLICY_ERROR
        assert d.candidates[0].url == "http://t2:1"
        assert {b.url for b in d.candidates} == {"http://l:1", "http://t1:1", "http://t2:1"}
    assert len([r for r in caplog.records if "routing policy failed" in r.message]) == 1
    assert router.failures == 3
