"""Tenants' priorities over real sockets: a latency simulator and a one-slot pool simulator
(`--max-num-seqs 1`, priority scheduling) behind a gateway with an interactive and a batch key.
Batch work stays on the pool; with both tiers full, an interactive request takes the place of a
batch one still waiting for its first byte, and that batch request is served later, not lost;
the engine gets vLLM's `priority` field."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import yaml

from gateway.pipeline.tenants import hash_key
from loadtests.harness.procs import GatewayProcess, SimProcess
from tests.integration.stack import wait_until_async

MODEL = "sim-model"
KEYS = {"interactive": "sk-prio-interactive", "batch": "sk-prio-batch"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    workdir: Path = tmp_path_factory.mktemp("priorities")
    common = ["--model", MODEL, "--speedup", "10", "--scheduling-policy", "priority"]
    lat = SimProcess(profile="v4", args=common)
    pool = SimProcess(profile="v3", args=[*common, "--max-num-seqs", "1"])
    procs: list[Any] = []
    try:
        procs += [lat.start(), pool.start()]
        doc = {
            "tiers": [
                {"name": "latency", "role": "latency", "backends": [
                    {"url": lat.url, "models": [MODEL], "priority_scheduling": True}]},
                {"name": "throughput", "role": "throughput", "backends": [
                    {"url": pool.url, "models": [MODEL], "priority_scheduling": True}]},
            ],
            "tenants": [{"name": f"{k}-t", "key_sha256": hash_key(v), "priority": k}
                        for k, v in KEYS.items()],
            # One stream fills the latency tier; one waiting request fills the pool.
            "policy": {"name": "golden-range", "latency_max_concurrency": 1,
                       "latency_hard_cap": 1, "hysteresis": 0, "max_waiting": 0,
                       "queue_deadline_s": 20},
            "monitor": {"scrape_interval_s": 0.05, "probe_interval_s": 0.5},
        }  # fmt: skip
        path = workdir / "gateway.yaml"
        path.write_text(yaml.safe_dump(doc))
        gw = GatewayProcess(config=path, log=workdir / "gateway.log")
        procs.append(gw.start())
        yield gw
    finally:
        for p in reversed(procs):
            p.stop()


def body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi there", "max_tokens": max_tokens, "ignore_eos": True,
            **extra}  # fmt: skip


def auth(kind: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[kind]}"}


def metric(gw: GatewayProcess, prefix: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))  # fmt: skip


def test_an_interactive_request_takes_a_waiting_batch_requests_place(
    gateway: GatewayProcess,
) -> None:
    async def run() -> tuple[list[int], int, list[str]]:
        async with aiohttp.ClientSession(gateway.url) as c:

            async def post(kind: str, tokens: int) -> tuple[int, str]:
                async with c.post("/v1/completions", json=body(tokens),
                                  headers=auth(kind)) as r:  # fmt: skip
                    await r.read()
                    return r.status, r.headers.get("x-tiergate-tier", "")

            async def view(role: str) -> dict[str, Any]:  # the gateway's view of the backend
                async with c.get("/state") as r:
                    (row,) = [b for b in (await r.json())["backends"] if b["role"] == role]
                return dict(row)

            async def latency_full() -> bool:
                return bool((await view("latency"))["effective"] >= 1)

            async def pool_queued() -> bool:
                row = await view("throughput")
                return not row["stale"] and row["waiting"] > 0

            # The latency tier's one slot: a long interactive stream.
            long_one = asyncio.create_task(post("interactive", 1500))
            await wait_until_async(latency_full, "the latency tier's slot taken")
            # The pool: one batch request runs, two wait for their first byte.
            batch = [asyncio.create_task(post("batch", 400)) for _ in range(3)]
            # Scraped: the pool's queue is long, both tiers full.
            await wait_until_async(pool_queued, "the pool's queue scraped")
            status, tier = await asyncio.wait_for(post("interactive", 8), 10)
            done = await asyncio.gather(*batch, long_one)
            return [s for s, _ in done], status, [tier, *(t for _, t in done[:3])]

    statuses, status, tiers = asyncio.run(run())
    assert status == 200  # not queued until 429: it took a waiting batch request's place
    assert tiers[0] == "throughput"
    assert statuses == [200, 200, 200, 200]  # the displaced batch request too, later
    assert set(tiers[1:]) == {"throughput"}  # batch work on the pool only
    assert metric(gateway, "tiergate_displaced_total{") == 1
    assert metric(gateway, 'tiergate_routing_decisions_total{policy="golden-range",'
                           'reason="displaced"') == 1  # fmt: skip


def test_the_engine_gets_the_priority_field(gateway: GatewayProcess) -> None:
    # The simulator refuses a nonzero priority unless it schedules by priority (as vLLM does),
    # and this one does: the batch key's requests (priority 1) are served.
    r = httpx.post(gateway.url + "/v1/completions", json=body(4), headers=auth("batch"))
    assert r.status_code == 200
    plain = SimProcess(profile="instant", args=["--model", MODEL]).start()
    try:
        refused = httpx.post(plain.url + "/v1/completions", json=body(4, priority=1))
        assert refused.status_code == 400
        assert "Priority scheduling is not enabled" in refused.json()["error"]["message"]
    finally:
        plain.stop()
