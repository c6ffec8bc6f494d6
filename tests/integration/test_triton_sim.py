"""The simulator's Triton face over real sockets: Triton's generate extension as the vLLM backend
answers it, health and metadata, errors, and the metrics port."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.wire.triton.metrics import parse_triton_metrics
from loadtests.harness.procs import SimProcess

NAME = "llama31-8b-awq"
OUTPUTS = {"return_finish_reason": True, "return_num_input_tokens": True,
           "return_num_output_tokens": True}  # fmt: skip


@pytest.fixture(scope="module")
def triton() -> Iterator[SimProcess]:
    with SimProcess(profile="v3", api="triton", metrics_port=0, args=["--speedup", "20"]) as sim:
        yield sim


def gen(sim: SimProcess, kind: str = "generate", **body: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}/v2/models/{NAME}/{kind}", json=body, timeout=30)


def events(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    text = r.text
    assert text.endswith("\n\n")
    assert "[DONE]" not in text  # Triton's streams just end
    parts = text.split("\n\n")[:-1]
    assert all(p.startswith("data: ") for p in parts)
    return [json.loads(p[6:]) for p in parts]


def page(sim: SimProcess) -> str:
    return httpx.get(sim.metrics_url).text


def value(text: str, line_start: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith(line_start + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_health_metadata_and_routes(triton: SimProcess) -> None:
    for path in ("/v2/health/ready", "/v2/health/live", f"/v2/models/{NAME}/ready",
                 f"/v2/models/{NAME}/versions/1/ready"):  # fmt: skip
        r = httpx.get(triton.url + path)
        assert (r.status_code, r.content) == (200, b""), path
    meta = httpx.get(f"{triton.url}/v2/models/{NAME}").json()
    assert (meta["name"], meta["versions"], meta["platform"]) == (NAME, ["1"], "vllm")
    assert {"text_input", "stream", "exclude_input_in_output", "return_num_input_tokens"} <= {
        i["name"] for i in meta["inputs"]
    }
    config = httpx.get(f"{triton.url}/v2/models/{NAME}/config").json()
    assert (config["backend"], config["model_transaction_policy"]) == ("vllm", {"decoupled": True})
    assert httpx.get(triton.url + "/v2").json()["name"] == "triton"
    r = httpx.post(f"{triton.url}/v2/models/other/generate", json={"text_input": "x"})
    assert (r.status_code, r.json()) == (400, {"error": "Request for unknown model: 'other' is "
                                                        "not found"})  # fmt: skip
    assert httpx.post(f"{triton.url}/v2/models/{NAME}/versions/2/generate",
                      json={"text_input": "x"}).status_code == 400  # fmt: skip
    assert httpx.get(triton.url + "/v1/models").json() == {"error": "Not Found"}
    r = httpx.get(f"{triton.url}/v2/models/{NAME}/generate")
    assert (r.status_code, r.json()) == (405, {"error": "Method Not Allowed"})


def test_generate(triton: SimProcess) -> None:
    # Without exclude_input_in_output the vLLM backend starts the reply with the prompt.
    r = gen(triton, text_input="one two three", parameters={"max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"model_name": NAME, "model_version": "1",
                        "text_output": "one two three the under a engine under"}  # fmt: skip
    r = gen(triton, id="r-1", text_input="one two three",
            parameters={"max_tokens": 5, "ignore_eos": True, "exclude_input_in_output": True,
                        **OUTPUTS})  # fmt: skip
    assert r.json() == {"id": "r-1", "model_name": NAME, "model_version": "1",
                        "text_output": " the under a engine under", "finish_reason": "length",
                        "num_input_tokens": 3, "num_output_tokens": 5}  # fmt: skip
    # Several stop strings go through the sampling_parameters input (a JSON string).
    r = gen(triton, text_input="x", exclude_input_in_output=True, return_finish_reason=True,
            sampling_parameters=json.dumps({"stop": [" engine", "zzz"], "max_tokens": 9,
                                            "ignore_eos": True}))  # fmt: skip
    assert (r.json()["text_output"], r.json()["finish_reason"]) == (" the under a", "stop")


def test_generate_stream(triton: SimProcess) -> None:
    params = {"stream": True, "max_tokens": 12, "ignore_eos": True, **OUTPUTS}
    r = gen(triton, "generate_stream", text_input="a b", parameters=params)
    assert r.status_code == 200
    evs = events(r)
    assert len(evs) >= 2
    assert [e["finish_reason"] for e in evs] == ["None"] * (len(evs) - 1) + ["length"]
    assert sum(e["num_output_tokens"] for e in evs) == 12
    assert all(e["num_input_tokens"] == 2 for e in evs)
    assert "".join(e["text_output"] for e in evs).count(" ") == 12
    # generate_stream without stream: one response, at the end.
    r = gen(triton, "generate_stream", text_input="a b", exclude_input_in_output=True,
            parameters={"max_tokens": 4, "ignore_eos": True})  # fmt: skip
    (ev,) = events(r)
    assert ev["text_output"].count(" ") == 4
    # generate with stream: several responses where one is expected; Triton has sent 200.
    r = gen(triton, text_input="a", parameters={"stream": True, "max_tokens": 6,
                                                "ignore_eos": True})  # fmt: skip
    assert r.status_code == 200
    assert r.json()["error"].startswith("generate expects model to produce exactly 1 response")


@pytest.mark.parametrize(
    ("kind", "body", "headers", "status", "error"),
    [
        ("generate", {"text_input": "x", "parameters": {"stop": ["a", "b"]}}, {}, 400,
         "parameter 'stop' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ("generate", {"parameters": {"max_tokens": 2}}, {}, 400, "missing required input"),
        ("generate", {"text_input": "x", "parameters": {"priority": 1}}, {}, 500,
         "Error generating stream: invalid sampling parameters"),
        ("generate", {"text_input": "w " * 5000}, {}, 500,
         "Error generating stream: The decoder prompt (length 5000) is longer than the maximum"),
        ("generate", {"text_input": "x"}, {"x-sim-fault": "error"}, 500,
         "Error generating stream: Simulated engine failure"),
        ("generate_stream", {"text_input": "x", "stream": True, "exclude_input_in_output": False},
         {}, 500,
         "Error generating stream: When streaming, `exclude_input_in_output` = False"),
        ("generate_stream", {"text_input": "x", "stream": True, "exclude_input_in_output": True},
         {"x-sim-fault": "error"}, 500, "Error generating stream: Simulated engine failure"),
    ],
)  # fmt: skip
def test_errors(
    triton: SimProcess, kind: str, body: dict[str, Any], headers: dict[str, str], status: int,
    error: str,
) -> None:  # fmt: skip
    r = httpx.post(f"{triton.url}/v2/models/{NAME}/{kind}", json=body, headers=headers)
    assert r.status_code == status
    # The first response sets the status; a stream's is SSE-framed even when it is an error.
    payload = events(r)[0] if kind == "generate_stream" else r.json()
    assert set(payload) == {"error"}
    assert error in payload["error"], payload


def test_error_after_the_first_event_is_an_event(triton: SimProcess) -> None:
    r = httpx.post(f"{triton.url}/v2/models/{NAME}/generate_stream",
                   json={"text_input": "x", "parameters": {"stream": True, "max_tokens": 30,
                         "exclude_input_in_output": True, "ignore_eos": True}},
                   headers={"x-sim-fault": "error-mid"})  # fmt: skip
    assert r.status_code == 200
    evs = events(r)
    assert "text_output" in evs[0]
    assert evs[-1] == {"error": "Error generating stream: Simulated engine failure mid-stream "
                                "(fault injection)."}  # fmt: skip


def test_metrics_port_counts_and_pending(triton: SimProcess) -> None:
    assert triton.metrics_url != triton.url + "/metrics"
    assert httpx.get(triton.url + "/metrics").status_code == 404  # Triton's HTTP port has none
    lab = f'{{model="{NAME}",version="1"}}'
    before = page(triton)
    ok = value(before, "nv_inference_request_success" + lab)
    failed = value(before, f'nv_inference_request_failure{{model="{NAME}",reason="BACKEND",'
                           'version="1"}')  # fmt: skip
    gen(triton, text_input="a b c", parameters={"max_tokens": 3, "ignore_eos": True})
    gen(triton, text_input="a", parameters={"max_tokens": 3})
    httpx.post(f"{triton.url}/v2/models/{NAME}/generate", json={"text_input": "x"},
               headers={"x-sim-fault": "error"})  # fmt: skip
    after = page(triton)
    assert value(after, "nv_inference_request_success" + lab) == ok + 2
    assert value(after, f'nv_inference_request_failure{{model="{NAME}",reason="BACKEND",'
                        'version="1"}') == failed + 1  # fmt: skip
    assert value(after, "vllm:generation_tokens_total" + lab) >= 3
    assert value(after, "nv_inference_pending_request_count" + lab) == 0

    async def pending_while_delayed() -> tuple[float, float]:
        # A request is pending until the engine takes it: a slow start keeps three pending.
        async with httpx.AsyncClient(timeout=30) as c:
            body = {"text_input": "x", "parameters": {"max_tokens": 2}}
            url = f"{triton.url}/v2/models/{NAME}/generate"
            tasks = [asyncio.create_task(c.post(url, json=body, headers={"x-sim-fault": "slow=20"}))
                     for _ in range(3)]  # fmt: skip
            deadline = time.monotonic() + 10
            seen = 0.0
            while seen < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                seen = value((await c.get(triton.metrics_url)).text,
                             "nv_inference_pending_request_count" + lab)  # fmt: skip
            parsed = parse_triton_metrics((await c.get(triton.metrics_url)).text)[NAME]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return seen, parsed.waiting

    seen, waiting = asyncio.run(pending_while_delayed())
    assert (seen, waiting) == (3, 3)
    # Cancelled by their clients, they leave the books.
    deadline = time.monotonic() + 5
    while value(page(triton), "nv_inference_pending_request_count" + lab) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    final = page(triton)
    assert value(final, "nv_inference_pending_request_count" + lab) == 0
    canceled = f'nv_inference_request_failure{{model="{NAME}",reason="CANCELED",version="1"}}'
    assert value(final, canceled) == 3


def test_unhealthy_is_not_ready(triton: SimProcess) -> None:
    httpx.post(triton.url + "/sim/faults", json={"unhealthy": True})
    try:
        assert httpx.get(triton.url + "/v2/health/ready").status_code == 400
        assert httpx.get(triton.url + "/v2/health/live").status_code == 200
        assert httpx.get(f"{triton.url}/v2/models/{NAME}/ready").status_code == 400
    finally:
        httpx.post(triton.url + "/sim/faults", json={"unhealthy": False})
    assert httpx.get(triton.url + "/v2/health/ready").status_code == 200


def test_metrics_on_the_main_port_without_a_metrics_port() -> None:
    with SimProcess(profile="instant", api="triton", args=["--model", "tiny"]) as sim:
        assert sim.metrics_url == sim.url + "/metrics"
        r = httpx.post(sim.url + "/v2/models/tiny/generate", json={"text_input": "x"})
        assert r.json()["model_name"] == "tiny"
        assert 'nv_inference_request_success{model="tiny",version="1"} 1' in page(sim)


def test_cli_refuses_a_model_name_with_a_slash() -> None:
    cmd = [sys.executable, "-m", "tiergate", "sim", "--api", "triton", "--model", "a/b"]
    done = subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert b"without '/'" in done.stderr
