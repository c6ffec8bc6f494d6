"""The gateway in front of Triton (the simulator's Triton face) over real sockets: the OpenAI
client through it, over Triton's HTTP generate API and over its gRPC stream, chat kept off
Triton, a tier mixing Triton and vLLM, failover when a Triton instance dies, load read from
Triton's metrics port, readiness and models read through tritonclient."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from loadtests.harness.procs import GatewayProcess, ManagedProcess, SimProcess, start_all
from tests.integration.stack import wait_until, wait_until_async

# Bounds on time and placement: run after the parallel tests, alone (scripts/test).
pytestmark = pytest.mark.serial

MODEL = "meta-llama/Llama-2-7b-chat-hf"
NAME = "llama31-8b-awq"  # the model's name in Triton's repository
BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 16,
                        "ignore_eos": True}  # fmt: skip


PROTOCOLS = ["http", "grpc"]


def backend(sim: SimProcess, protocol: str = "http", model: str = NAME) -> dict[str, Any]:
    if sim.api == "triton":
        out = {"url": sim.url, "kind": "triton", "metrics_url": sim.metrics_url,
               "models": [MODEL], "triton_models": {MODEL: model}}  # fmt: skip
        if protocol == "grpc":
            out["triton_grpc"] = sim.grpc_target
        return out
    return {"url": sim.url, "models": [MODEL]}


def gateway(
    workdir: Path, name: str, pool: list[SimProcess], protocol: str = "http", **triton: Any
) -> GatewayProcess:
    backends = [backend(s, protocol, **triton) for s in pool]
    cfg = {
        "tiers": [{"name": "pool", "role": "throughput", "backends": backends}],
        "log_level": "info",
        "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5},
        # Routing by load alone: these tests watch the load the gateway reads from Triton
        # (with affinity, a prompt sent again would go back to the engine that answered it).
        "policy": {"name": "golden-range", "prefix_affinity": False},
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return GatewayProcess(config=path, log=workdir / f"{name}.log")


def triton_sim(speedup: int, workdir: Path) -> SimProcess:
    return SimProcess(profile="v3", api="triton", metrics_port=0, grpc_port=0,
                      log=workdir / "triton.log",
                      args=["--speedup", str(speedup), "--model", NAME])  # fmt: skip


@dataclass
class Deployment:
    triton: SimProcess
    vllm: SimProcess
    only_triton: GatewayProcess  # one tier: the Triton instance alone
    mixed: GatewayProcess  # one tier: the Triton instance and a vLLM one
    only_grpc: GatewayProcess  # the Triton instance alone, over gRPC
    missing: GatewayProcess  # over gRPC, mapped to a model Triton does not have; and vLLM

    def only(self, protocol: str) -> GatewayProcess:
        return self.only_grpc if protocol == "grpc" else self.only_triton


@contextlib.contextmanager
def running(*procs: ManagedProcess) -> Iterator[None]:
    """All of `procs` started at once (each waits for its own readiness), all stopped after."""
    with contextlib.ExitStack() as stack:
        start_all(stack, *procs)
        yield


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("triton-gw")
    t = triton_sim(10, work)
    v = SimProcess(profile="v3", args=["--speedup", "10"], log=work / "vllm.log")
    with running(t, v):
        only, mixed = gateway(work, "only", [t]), gateway(work, "mixed", [t, v])
        only_grpc = gateway(work, "grpc", [t], "grpc")
        missing = gateway(work, "missing", [t, v], "grpc", model="missing")
        with running(only, mixed, only_grpc, missing):
            yield Deployment(t, v, only, mixed, only_grpc, missing)


def state(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    return {b["url"]: b for b in httpx.get(gw.url + "/state").json()["backends"]}


def chunks(text: str) -> list[Any]:
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    parts = text.split("\n\n")[:-1]
    assert all(p.startswith("data: ") for p in parts)
    return [json.loads(p[6:]) for p in parts[:-1]]


# -- the OpenAI API on Triton -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_openai_client_non_streaming_and_streaming(d: Deployment, protocol: str) -> None:
    client = openai.OpenAI(base_url=d.only(protocol).url + "/v1", api_key="EMPTY", max_retries=0)
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hello there", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert raw.headers["x-tiergate-backend"] == d.triton.url
    out = raw.parse()
    assert out.object == "text_completion"
    assert out.model == MODEL
    assert out.id == "cmpl-" + raw.headers["x-request-id"]
    assert out.choices[0].text.count(" ") == 8
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        2, 8, 10)  # fmt: skip

    got = list(client.completions.create(
        model=MODEL, prompt="hello there", max_tokens=20, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))  # fmt: skip
    assert got[-1].choices == []
    assert got[-1].usage is not None
    assert (got[-1].usage.prompt_tokens, got[-1].usage.completion_tokens) == (2, 20)
    assert "".join(c.choices[0].text for c in got if c.choices).count(" ") == 20
    assert [c.choices[0].finish_reason for c in got if c.choices][-1] == "length"
    assert len({c.id for c in got}) == 1

    plain = list(client.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True,
                                           extra_body={"ignore_eos": True}))  # fmt: skip
    assert all(c.usage is None for c in plain)
    assert plain[-1].choices[0].finish_reason == "length"

    # Several stop strings travel as sampling_parameters; the stop string is cut, as in vLLM.
    out = client.completions.create(model=MODEL, prompt="x", max_tokens=9, stop=[" engine", "zz"],
                                    extra_body={"ignore_eos": True})  # fmt: skip
    assert (out.choices[0].text, out.choices[0].finish_reason) == (" the under a", "stop")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_stream_on_the_wire(d: Deployment, protocol: str) -> None:
    r = httpx.post(d.only(protocol).url + "/v1/completions", json=BODY | {"stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    got = chunks(r.text)
    assert "".join(c["choices"][0]["text"] for c in got).count(" ") == 16
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in got)


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
         None, "chat template"),
        ("/v1/completions", BODY | {"prompt": [1, 2, 3]}, "prompt", "one text prompt"),
        ("/v1/completions", BODY | {"n": 2}, "n", "one choice"),
        ("/v1/completions", BODY | {"echo": True}, "echo", "cannot return echo"),
    ],
)  # fmt: skip
def test_what_triton_cannot_serve_is_a_400_when_only_triton_serves_the_model(
    d: Deployment, path: str, body: dict[str, Any], param: str | None, words: str
) -> None:
    r = httpx.post(d.only_triton.url + path, json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("BadRequestError", param, 400)
    assert words in err["message"]
    assert "is Triton" in err["message"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("body", "headers", "status", "kind", "message"),
    [
        (BODY, {"x-sim-fault": "error"}, 500, "InternalServerError",
         "Error generating stream: Simulated engine failure"),
        (BODY | {"stream": True}, {"x-sim-fault": "error"}, 500, "InternalServerError",
         "Error generating stream: Simulated engine failure"),
        (BODY | {"prompt": "w " * 5000}, {}, 500, "InternalServerError",
         "Error generating stream: The decoder prompt (length 5000)"),
        (BODY | {"top_p": 7.0}, {}, 500, "InternalServerError", "Error generating stream: top_p"),
    ],
)  # fmt: skip
def test_triton_errors_become_openai_errors(
    d: Deployment, body: dict[str, Any], headers: dict[str, str], status: int, kind: str,
    message: str, protocol: str,
) -> None:  # fmt: skip
    r = httpx.post(d.only(protocol).url + "/v1/completions", json=body, headers=headers)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["code"]) == (kind, status)
    assert err["message"].startswith(message), err
    assert r.headers["x-tiergate-attempts"] == "1"  # a 500 is the engine's answer, not retried


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_error_in_the_middle_of_a_triton_stream(d: Deployment, protocol: str) -> None:
    r = httpx.post(d.only(protocol).url + "/v1/completions",
                   json=BODY | {"stream": True, "max_tokens": 40},
                   headers={"x-sim-fault": "error-mid"})  # fmt: skip
    assert r.status_code == 200
    got = chunks(r.text)
    assert got[0]["choices"][0]["text"]
    assert got[-1]["error"]["message"].startswith("Error generating stream: Simulated engine")


# -- a tier mixing Triton and vLLM ------------------------------------------------------------


def test_mixed_tier_keeps_chat_off_triton_and_spreads_completions(d: Deployment) -> None:
    gw = d.mixed.url
    for _ in range(3):
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        r = httpx.post(gw + "/v1/chat/completions", json=chat)
        assert r.status_code == 200
        assert r.headers["x-tiergate-backend"] == d.vllm.url

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            body = BODY | {"max_tokens": 64, "stream": True,
                           "stream_options": {"include_usage": True}}  # fmt: skip
            return list(await asyncio.gather(
                *(c.post(gw + "/v1/completions", json=body) for _ in range(12))))  # fmt: skip

    responses = asyncio.run(run())
    by_backend = Counter(r.headers["x-tiergate-backend"] for r in responses)
    assert set(by_backend) == {d.triton.url, d.vllm.url}, by_backend
    for r in responses:
        got = chunks(r.text)
        assert "error" not in got[-1]
        assert got[-1]["usage"]["completion_tokens"] == 64
        assert set(got[0]) == {"id", "object", "created", "model", "choices"}
    # Non-streamed, both kinds answer with the same shape.
    shapes = set()
    for _ in range(6):
        r = httpx.post(gw + "/v1/completions", json=BODY)
        shapes.add((r.headers["x-tiergate-backend"], tuple(sorted(r.json())),
                    tuple(sorted(r.json()["usage"].items()))))  # fmt: skip
    assert len({s[1:] for s in shapes}) == 1, shapes


def test_gateway_reads_triton_load_from_its_metrics_port(d: Deployment) -> None:
    """Three requests sent straight to Triton wait (a slow start) before its engine takes them:
    Triton counts them pending on its metrics port, the gateway reads that as the backend's
    waiting count, and routes its own requests to the vLLM backend meanwhile."""
    gw, t = d.mixed.url, d.triton.url
    assert httpx.get(t + "/metrics").status_code == 404  # so the monitor reads the metrics port

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            direct = [asyncio.create_task(c.post(
                f"{t}/v2/models/{NAME}/generate", json={"text_input": "x"},
                headers={"x-sim-fault": "slow=30"})) for _ in range(3)]  # fmt: skip
            try:
                seen = await asyncio.to_thread(
                    wait_until, lambda: state(d.mixed)[t]["waiting"] == 3, "3 waiting", 10)
                assert seen, state(d.mixed)[t]
                row = state(d.mixed)[t]
                assert (row["healthy"], row["stale"], row["inflight"]) == (True, False, 0)
                assert row["effective"] == 3
                for _ in range(4):
                    r = await c.post(gw + "/v1/completions", json=BODY)
                    assert r.headers["x-tiergate-backend"] == d.vllm.url
            finally:
                for task in direct:
                    task.cancel()
                await asyncio.gather(*direct, return_exceptions=True)

    asyncio.run(run())
    assert wait_until(lambda: state(d.mixed)[t]["waiting"] == 0, "Triton's queue empty", 10)
    metrics = httpx.get(gw + "/metrics").text
    depth = f'tiergate_backend_queue_depth{{backend="{t}",state="waiting",tier="throughput"}}'
    assert depth in metrics


def test_readiness_is_read_through_tritonclient(d: Deployment) -> None:
    """Over HTTP (/v2/health/ready answers 400) and over gRPC (ServerReady says false)."""
    t = d.triton.url
    httpx.post(t + "/sim/faults", json={"unhealthy": True})
    try:
        for gw in (d.mixed, d.only_grpc):
            assert wait_until(lambda gw=gw: not state(gw)[t]["healthy"], "Triton unhealthy", 10)
            assert state(gw)[t]["ejected_reason"] == "scrape_health server not ready"
        r = httpx.post(d.mixed.url + "/v1/completions", json=BODY)
        assert r.headers["x-tiergate-backend"] == d.vllm.url
    finally:
        httpx.post(t + "/sim/faults", json={"unhealthy": False})
    assert wait_until(lambda: state(d.mixed)[t]["healthy"] and state(d.only_grpc)[t]["healthy"],
                      "Triton healthy again", 10)  # fmt: skip


def test_a_model_triton_does_not_have_is_reported_and_its_backend_ejected(d: Deployment) -> None:
    t = d.triton.url
    assert wait_until(lambda: not state(d.missing)[t]["healthy"], "its backend ejected", 10)
    assert state(d.missing)[t]["ejected_reason"] == "scrape_health model missing not ready"
    assert d.missing.log is not None
    log = d.missing.log.read_text()
    assert "model 'missing' is not ready" in log
    assert log.count("model 'missing' is not ready") == 1  # once, not every probe
    r = httpx.post(d.missing.url + "/v1/completions", json=BODY)
    assert (r.status_code, r.headers["x-tiergate-backend"]) == (200, d.vllm.url)


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_killing_a_triton_backend_loses_no_request_that_had_not_streamed(
    tmp_path: Path, protocol: str
) -> None:
    t = triton_sim(2, tmp_path)
    v = SimProcess(profile="v3", args=["--speedup", "2"], log=tmp_path / "vllm.log")
    with running(t, v):
        g = gateway(tmp_path, "gw", [t, v], protocol)
        with running(g):

            async def run() -> tuple[list[httpx.Response], list[tuple[bool, str]]]:
                under_way = 0
                async with httpx.AsyncClient(timeout=60) as c:
                    url = g.url + "/v1/completions"
                    plain = [asyncio.create_task(c.post(url, json=BODY | {"max_tokens": 200}))
                             for _ in range(24)]  # fmt: skip

                    async def stream() -> tuple[bool, str]:
                        nonlocal under_way
                        started, text = False, ""
                        body = BODY | {"max_tokens": 200, "stream": True}
                        async with c.stream("POST", url, json=body) as r:
                            async for part in r.aiter_text():
                                if not started:
                                    under_way += 1
                                started, text = True, text + part
                        return started, text

                    async def on_triton() -> bool:
                        rows = (await c.get(g.url + "/state")).json()["backends"]
                        (row,) = [b for b in rows if b["url"] == t.url]
                        return under_way == len(streams) and row["inflight"] > 0

                    streams = [asyncio.create_task(stream()) for _ in range(6)]
                    await wait_until_async(on_triton, "every stream under way and requests in "
                                           "flight at the Triton instance")  # fmt: skip
                    t.kill()
                    return list(await asyncio.gather(*plain)), list(await asyncio.gather(*streams))

            plain, streams = asyncio.run(run())
            # Not one non-streamed request is lost: none had sent a byte to its client.
            assert [r.status_code for r in plain] == [200] * len(plain)
            assert all(r.json()["usage"]["completion_tokens"] == 200 for r in plain)
            retried = [r for r in plain if r.headers["x-tiergate-attempts"] != "1"]
            assert retried, "no request was on the Triton instance when it died"
            assert {r.headers["x-tiergate-backend"] for r in retried} == {v.url}
            # A stream cut after its first byte ends with an error event and [DONE].
            for started, text in streams:
                assert started
                assert text.endswith("data: [DONE]\n\n")
            assert wait_until(lambda: not state(g)[t.url]["healthy"], "Triton ejected", 10)
            for _ in range(4):
                r = httpx.post(g.url + "/v1/completions", json=BODY)
                assert r.status_code == 200
                assert r.headers["x-tiergate-backend"] == v.url
