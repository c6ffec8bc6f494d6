"""The gateway app from its ASGI factory (gateway.serve.asgi) under granian, another server than
`tiergate serve`'s: with the official client, a completion and a stream answered with the
engine's content and usage, a client's mistake an OpenAI error, and the side endpoints up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from loadtests.harness.procs import GranianGatewayProcess, SimProcess
from loadtests.harness.proxied import gateway_config

MODEL = "sim-model"

pytestmark = pytest.mark.skipif(
    not GranianGatewayProcess.available(), reason="granian is not installed (extra `load`)"
)


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    work: Path = tmp_path_factory.mktemp("asgi")
    with SimProcess(profile="instant", args=("--model", MODEL), log=work / "sim.log") as sim:
        config = work / "gateway.yaml"
        config.write_text(yaml.safe_dump(gateway_config(sim.url, MODEL)))
        with GranianGatewayProcess(config=config, log=work / "granian.log") as gw:
            yield gw.url, sim.url


def test_a_completion_and_a_stream_come_through_as_the_engine_sends_them(
    urls: tuple[str, str],
) -> None:
    gw_url, sim_url = urls
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 12, "ignore_eos": True}
    direct = httpx.post(sim_url + "/v1/completions", json=body, timeout=10).json()
    client = openai.OpenAI(base_url=gw_url + "/v1", api_key="none", max_retries=0)
    got = client.completions.create(model=MODEL, prompt="hello there", max_tokens=12,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    assert got.choices[0].text == direct["choices"][0]["text"]
    assert got.usage is not None
    assert got.usage.completion_tokens == 12
    chunks = list(client.completions.create(
        model=MODEL, prompt="hello there", max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == direct["choices"][0]["text"]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1
    assert usage[0].completion_tokens == 12


def test_a_clients_mistake_is_an_openai_error_and_the_side_endpoints_answer(
    urls: tuple[str, str],
) -> None:
    gw_url, _ = urls
    bad = httpx.post(gw_url + "/v1/completions", content=b"{not json", timeout=10,
                     headers={"content-type": "application/json"})  # fmt: skip
    assert bad.status_code == 400
    error = json.loads(bad.text)["error"]
    assert error["code"] == 400
    assert error["type"] == "BadRequestError"
    assert error["message"]
    assert httpx.get(gw_url + "/ready", timeout=10).status_code == 200
    metrics = httpx.get(gw_url + "/metrics", timeout=10).text
    assert "tiergate_requests_total" in metrics
