"""The planner over real sockets: a gateway in front of simulators counts the demand of its
requests per SLO class, learns each tier's curves, and publishes the replicas each tier needs
on /metrics (for an autoscaler) and in /state; more demand asks for more replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.stack import MODEL, Stack, start_stack, wait_until

BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 32,
                        "ignore_eos": True, "stream": True}  # fmt: skip
CLASS = "ttft<=1000ms,tpot<=25ms"  # the default SLO's


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("planner"), speedup=10,
                    planner={"interval_s": 0.2, "tau_s": 2.0, "startup_s": 0.0})  # fmt: skip
    yield s
    s.stop()


def plan(gw: str) -> dict[str, Any]:
    value: dict[str, Any] = httpx.get(gw + "/state").json()["plan"]
    return value


def load(gw: str, users: int, requests: int) -> None:
    """`users` closed-loop users, `requests` each."""

    async def user(c: httpx.AsyncClient) -> None:
        for _ in range(requests):
            r = await c.post(gw + "/v1/completions", json=BODY)
            assert r.status_code == 200

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            await asyncio.gather(*(user(c) for _ in range(users)))

    asyncio.run(run())


def covered(p: dict[str, Any]) -> bool:
    """The plan's replicas serve its demand within the SLO, by its own capacities."""
    served = sum(t["desired"] * t["capacity_rps"][CLASS] for t in p["tiers"])
    return bool(served >= p["demand_rps"][CLASS])


def test_the_plan_follows_the_demand_and_is_published(stack: Stack) -> None:
    gw = stack.gateway.url
    idle = plan(gw)
    # Before any request: no demand, each tier at no fewer replicas than it has (nothing
    # learned yet).
    assert {t["name"]: t["desired"] for t in idle["tiers"]} == {"eagle": 1, "awq": 2}
    assert idle["demand_rps"] == {}

    load(gw, users=2, requests=10)
    light = wait_until(lambda: (p := plan(gw))["demand_rps"].get(CLASS) and p, "demand counted")
    assert any(t["capacity_rps"][CLASS] > 0 for t in light["tiers"]), light
    assert covered(light), light
    load(gw, users=24, requests=10)
    heavy = wait_until(
        lambda: (p := plan(gw))["demand_rps"][CLASS] > 2 * light["demand_rps"][CLASS] and p,
        "more demand counted",
    )
    assert covered(heavy), heavy
    assert heavy["unmet"] == []

    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(gw + "/metrics").text)}
    desired = {s.labels["tier"]: s.value for s in fams["tiergate_tier_desired_replicas"].samples}
    assert set(desired) == {"eagle", "awq"}
    assert all(v >= 1 for v in desired.values())
    current = {s.labels["tier"]: s.value for s in fams["tiergate_tier_replicas"].samples}
    assert current == {"eagle": 1, "awq": 2}
    demand = {s.labels["slo_class"]: s.value for s in fams["tiergate_demand_rps"].samples}
    assert demand[CLASS] > 0
