"""Tenants over real sockets: two gateway replicas sharing a real Redis, in front of an instant
simulator. Named keys, limits counted across both replicas, tokens charged by the engine's
usage, OpenAI's rate-limit headers, Redis killed (limits fall back to each replica's own counts,
no errors), keys kept out of logs, metrics and /state, and the admin key on /metrics and
/state."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import redis
import yaml
from multidict import CIMultiDict

from gateway.pipeline.tenants import hash_key
from loadtests.harness.procs import GatewayProcess, SimProcess
from tests.conftest import RedisProcess
from tests.integration.stack import wait_until

MODEL = "sim-model"
KEYS = {"steady": "sk-test-steady", "tokens": "sk-test-tokens", "small": "sk-test-small",
        "open": "sk-test-open", "narrow": "sk-test-narrow"}  # fmt: skip
ADMIN = "admin-test-key"
RPM = 60


def tenants() -> list[dict[str, Any]]:
    def t(name: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, "key_sha256": hash_key(KEYS[name]), **extra}

    return [
        t("steady", priority="interactive", limits={"requests_per_minute": RPM}),
        t("tokens", priority="batch", limits={"tokens_per_minute": 300}),
        t("small", limits={"requests_per_minute": 5}),
        t("open"),
        t("narrow", models=["other-model"]),
    ]


class Deployment:
    def __init__(self, workdir: Path, redis: RedisProcess, sim: SimProcess) -> None:
        self.redis, self.sim = redis, sim
        self.gateways: list[GatewayProcess] = []
        doc = {
            "tiers": [{"name": "pool", "role": "throughput", "backends": [
                {"url": sim.url, "models": [MODEL, "other-model"]}]}],
            "tenants": tenants(),
            "redis_url": redis.url,
            "admin_key": ADMIN,
            "protect_ops": True,
            "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5},
        }  # fmt: skip
        for i in range(2):
            path = workdir / f"gateway-{i}.yaml"
            path.write_text(yaml.safe_dump(doc))
            gw = GatewayProcess(config=path, log=workdir / f"gateway-{i}.log")
            self.gateways.append(gw.start())

    def stop(self) -> None:
        for gw in self.gateways:
            gw.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    workdir = tmp_path_factory.mktemp("tenants")
    redis = RedisProcess(workdir)
    redis.start()
    sim = SimProcess(profile="instant", args=["--model", MODEL, "--model", "other-model"])
    d = None
    try:
        sim.start()
        d = Deployment(workdir, redis, sim)
        yield d
    finally:
        if d is not None:
            d.stop()
        sim.stop()
        redis.stop()


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hello there", "max_tokens": 4, "ignore_eos": True, **extra}


async def burst(urls: list[str], name: str, n: int) -> list[tuple[int, CIMultiDict[str]]]:
    """`n` requests of tenant `name`, 8 at a time, spread over the gateways in turn."""
    sem = asyncio.Semaphore(8)
    async with aiohttp.ClientSession() as c:

        async def one(i: int) -> tuple[int, CIMultiDict[str]]:
            async with sem, c.post(urls[i % len(urls)] + "/v1/completions", json=body(),
                                   headers=auth(name)) as r:  # fmt: skip
                await r.read()
                return r.status, CIMultiDict(r.headers)

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_a_limit_holds_across_two_replicas(deployment: Deployment) -> None:
    urls = [gw.url for gw in deployment.gateways]
    got = asyncio.run(burst(urls, "steady", RPM + 30))
    statuses = Counter(s for s, _ in got)
    assert statuses == {200: RPM, 429: 30}, statuses
    ok = [h for s, h in got if s == 200]
    refused = [h for s, h in got if s == 429]
    assert all(h["x-ratelimit-limit-requests"] == str(RPM) for h in ok + refused)
    assert sorted(int(h["x-ratelimit-remaining-requests"]) for h in ok) == list(range(RPM))
    for h in refused:
        assert h["x-ratelimit-remaining-requests"] == "0", h
        assert 55 <= int(h["retry-after"]) <= 60  # the first start leaves the window then
        assert h["x-ratelimit-reset-requests"].endswith("s")


def test_a_refusal_is_an_openai_error(deployment: Deployment) -> None:
    gw = deployment.gateways[0]
    r = httpx.post(gw.url + "/v1/completions", json=body(), headers=auth("steady"))
    assert r.status_code == 429
    error = r.json()["error"]
    assert error["type"] == "RateLimitError"
    assert "requests per minute of key `steady`" in error["message"]
    assert KEYS["steady"] not in r.text


def test_tokens_are_charged_by_the_engines_usage(deployment: Deployment) -> None:
    a, b = (gw.url for gw in deployment.gateways)
    first = httpx.post(a + "/v1/completions", json=body(max_tokens=100), headers=auth("tokens"))
    assert first.status_code == 200
    used = first.json()["usage"]["total_tokens"]
    assert used > 100
    # A stream whose client asked no usage: charged all the same, and no usage event shown.
    with httpx.stream("POST", b + "/v1/completions", headers=auth("tokens"),
                      json=body(max_tokens=100, stream=True)) as s:  # fmt: skip
        assert s.status_code == 200
        left_before = int(s.headers["x-ratelimit-remaining-tokens"])
        text = "".join(s.iter_text())
    assert '"usage"' not in text
    assert text.endswith("data: [DONE]\n\n")
    assert 300 - used - 5 <= left_before <= 300 - used + 5  # refilled a little meanwhile
    # The stream's charge goes to Redis as it ends: the tenant's bucket (gateway.pipeline.limits)
    # drops by about one more `used` below the level the stream was admitted at.
    bucket = redis.Redis.from_url(deployment.redis.url, decode_responses=True)
    try:
        wait_until(lambda: float(bucket.hget("tiergate:limits:tokens:tokens", "level") or 300)
                   < left_before - used / 2, "the stream's tokens charged in Redis")  # fmt: skip
    finally:
        bucket.close()
    third = httpx.post(a + "/v1/completions", json=body(max_tokens=100), headers=auth("tokens"))
    assert third.status_code == 200
    left = int(third.headers["x-ratelimit-remaining-tokens"])
    assert 300 - 2 * used - 5 <= left <= 300 - 2 * used + 10, (used, left)  # the stream's too
    r = httpx.post(b + "/v1/completions", json=body(max_tokens=1), headers=auth("tokens"))
    assert r.status_code == 429, r.text  # 300 - 3 x ~105 < 0
    assert "tokens per minute" in r.json()["error"]["message"]
    assert r.headers["x-ratelimit-remaining-tokens"] == "0"
    assert int(r.headers["retry-after"]) >= 1


def test_keys_are_checked_and_never_shown(deployment: Deployment) -> None:
    gw = deployment.gateways[0]
    for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": KEYS["open"]}):
        r = httpx.post(gw.url + "/v1/completions", json=body(), headers=headers)
        assert r.status_code == 401, r.text
    r = httpx.post(gw.url + "/v1/completions", json=body(), headers=auth("narrow"))
    assert r.status_code == 403
    assert "may not use the model `sim-model`" in r.json()["error"]["message"]
    assert httpx.post(gw.url + "/v1/completions", json=body(model="other-model"),
                      headers=auth("narrow")).status_code == 200  # fmt: skip
    admin = {"authorization": f"Bearer {ADMIN}"}
    metrics = httpx.get(gw.url + "/metrics", headers=admin).text
    state = httpx.get(gw.url + "/state", headers=admin).text
    logs = "".join(p.read_text() for p in gw_logs(deployment))
    assert 'tiergate_tenant_requests_total{status="200",tenant="narrow"}' in metrics
    assert 'tiergate_tenant_tokens_total{tenant="narrow"}' in metrics
    for key in KEYS.values():
        for where, text in (("metrics", metrics), ("state", state), ("logs", logs)):
            assert key not in text, where
            assert hash_key(key) not in text, where


def test_metrics_and_state_ask_for_the_admin_key(deployment: Deployment) -> None:
    gw = deployment.gateways[0]
    for path in ("/metrics", "/state"):
        for headers in ({}, auth("open")):
            r = httpx.get(gw.url + path, headers=headers)
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"]["type"] == "AuthenticationError"
        admin = {"authorization": f"Bearer {ADMIN}"}
        assert httpx.get(gw.url + path, headers=admin).status_code == 200
    assert httpx.get(gw.url + "/health").status_code == 200  # liveness stays open


def test_redis_gone_limits_fall_back_to_each_replica_without_errors(
    deployment: Deployment,
) -> None:
    urls = [gw.url for gw in deployment.gateways]
    deployment.redis.stop()
    try:
        got = asyncio.run(burst(urls, "open", 40))
        assert Counter(s for s, _ in got) == {200: 40}  # no limits of its own: never refused
        small = asyncio.run(burst(urls, "small", 20))
        # 5 a minute counted by each replica alone: 5 each, and no error.
        assert Counter(s for s, _ in small) == {200: 10, 429: 10}
        admin = {"authorization": f"Bearer {ADMIN}"}
        for url in urls:
            assert "tiergate_limits_degraded 1.0" in httpx.get(url + "/metrics",
                                                               headers=admin).text  # fmt: skip
        assert "rate limits counted per gateway process" in "".join(
            p.read_text() for p in gw_logs(deployment))  # fmt: skip
    finally:
        deployment.redis.start()
    # Back: shared again (a fresh Redis: the small tenant's 5 are there to take once more).
    deadline = time.monotonic() + 10
    while True:
        got = asyncio.run(burst(urls, "small", 1))
        text = httpx.get(urls[0] + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
        if "tiergate_limits_degraded 0.0" in text or time.monotonic() > deadline:
            break
    assert "tiergate_limits_degraded 0.0" in text


def gw_logs(d: Deployment) -> list[Path]:
    return [gw.log for gw in d.gateways if gw.log is not None]
