"""The shutdown and server settings: their bounds, and deployments whose grace periods leave the
gateway the time its drain settings ask for (Kubernetes and Compose kill it after theirs)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import yaml

from gateway.config.settings import ConfigError, Settings, load_settings
from gateway.core.exchange import Endpoint, Exchange
from gateway.pipeline.drain import Drain
from tests.unit.deployfiles import ROOT, raw_compose, yaml_documents

TIER = [{"name": "t", "role": "throughput",
         "backends": [{"url": "http://127.0.0.1:9", "models": ["m"]}]}]  # fmt: skip
# After the drain deadline: the cut requests end, the lifespan closes, the process exits.
EXIT_MARGIN_S = 5


def test_defaults() -> None:
    s = Settings()
    assert (s.shutdown.pre_stop_delay_s, s.shutdown.drain_timeout_s) == (0.0, 120.0)
    assert s.server.max_header_bytes == 16_384
    assert (s.server.header_timeout_s, s.server.body_timeout_s) == (10.0, 30.0)
    assert (s.server.keepalive_timeout_s, s.server.max_connections) == (5.0, 1000)


@pytest.mark.parametrize(
    ("section", "values", "field"),
    [("shutdown", {"pre_stop_delay_s": -1}, "shutdown.pre_stop_delay_s"),
     ("shutdown", {"drain_timeout_s": -0.5}, "shutdown.drain_timeout_s"),
     ("server", {"max_header_bytes": 100}, "server.max_header_bytes"),
     ("server", {"header_timeout_s": 0}, "server.header_timeout_s"),
     ("server", {"body_timeout_s": 7200}, "server.body_timeout_s"),
     ("server", {"max_connections": 0}, "server.max_connections"),
     ("server", {"max_conections": 10}, "server.max_conections")],
)  # fmt: skip
def test_invalid_values_name_their_field(section: str, values: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, tiers=TIER, **{section: values})
    assert any(p.startswith(field + ":") for p in err.value.problems), err.value.problems


def test_zero_waits_are_allowed_and_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_SHUTDOWN__DRAIN_TIMEOUT_S", "0")
    monkeypatch.setenv("TIERGATE_SERVER__MAX_CONNECTIONS", "64")
    s = load_settings(None, tiers=TIER, shutdown={"pre_stop_delay_s": 0})
    assert (s.shutdown.pre_stop_delay_s, s.shutdown.drain_timeout_s) == (0, 0)
    assert s.server.max_connections == 64


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)(s|m)", text)
    assert m, text
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def test_kubernetes_grace_covers_the_pre_stop_hook_and_the_drain() -> None:
    docs = yaml_documents(ROOT / "deploy" / "k8s" / "gateway.yaml")
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["tiergate.yaml"]
    shutdown = Settings(**yaml.safe_load(config)).shutdown
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    (gateway,) = pod["containers"]
    hook = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "sleep"
    need = float(hook[1]) + shutdown.pre_stop_delay_s + shutdown.drain_timeout_s
    assert float(hook[1]) >= 3  # endpoints and proxies take a moment to drop the pod
    assert pod["terminationGracePeriodSeconds"] >= need + EXIT_MARGIN_S


def test_compose_grace_covers_the_drain() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "compose" / "gateway.yaml").read_text())
    shutdown = Settings(**config).shutdown
    grace = _seconds(raw_compose()["services"]["gateway"]["stop_grace_period"])
    assert grace >= shutdown.pre_stop_delay_s + shutdown.drain_timeout_s + EXIT_MARGIN_S


# -- Drain: the live exchanges, waiting for them, cutting them ---------------------------------


def _exchange() -> Exchange:
    async def send(message: Any) -> None:
        pass

    return Exchange("id", Endpoint("/v1/completions", chat=False), {}, send, 0.0)


async def test_settle_returns_once_nothing_is_live() -> None:
    drain = Drain()
    ex = _exchange()
    task = asyncio.create_task(asyncio.sleep(0.1))
    drain.live[ex] = task
    task.add_done_callback(lambda _: drain.live.pop(ex))
    assert await drain.settle(5, asyncio.Event())
    assert task.done()


async def test_cut_gives_each_live_exchange_the_reason_and_cancels_its_task() -> None:
    drain = Drain()
    drain.begin()
    assert drain.draining
    exchanges = [_exchange() for _ in range(3)]
    tasks = [asyncio.create_task(asyncio.sleep(60)) for _ in exchanges]
    drain.live.update(zip(exchanges, tasks, strict=True))
    assert not await drain.settle(0.05, asyncio.Event())
    assert drain.cut("bye") == 3
    await asyncio.sleep(0)
    assert all(t.cancelled() for t in tasks)
    assert [ex.cut_reason for ex in exchanges] == ["bye"] * 3


async def test_hurry_ends_the_wait_at_once() -> None:
    drain = Drain()
    drain.live[_exchange()] = asyncio.create_task(asyncio.sleep(60))
    hurry = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, hurry.set)
    t0 = asyncio.get_running_loop().time()
    assert not await drain.settle(60, hurry)
    assert asyncio.get_running_loop().time() - t0 < 1
    for task in drain.live.values():
        task.cancel()
