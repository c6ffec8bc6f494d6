"""The simulator over real sockets: vLLM's wire format field by field, metrics, queueing,
preemption, speculative chunking, faults and bad input."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.front.metrics import ITL_BUCKETS, REQUEST_BUCKETS, TTFT_BUCKETS
from gateway.wire.vllm.metrics import METRICS_QUERY, SERIES, parse_vllm_metrics
from loadtests.harness.procs import SimProcess

MODEL = "meta-llama/Llama-2-7b-chat-hf"


@pytest.fixture(scope="module")
def v3() -> Iterator[SimProcess]:
    with SimProcess(profile="v3", args=["--speedup", "20"]) as sim:
        yield sim


@pytest.fixture(scope="module")
def v4() -> Iterator[SimProcess]:
    with SimProcess(profile="v4", args=["--speedup", "5"]) as sim:
        yield sim


def sse_events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def metrics(url: str) -> dict[str, list[Any]]:
    text = httpx.get(url + "/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def sample(fams: dict[str, list[Any]], name: str, **labels: str) -> float:
    family = name.removesuffix("_total")
    for s in fams[family]:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise KeyError(name)


BODY = {"model": MODEL, "prompt": "one two three four five", "max_tokens": 12, "ignore_eos": True}


def test_metrics_page_gives_the_series_a_scraper_names(v3: SimProcess) -> None:
    """As vLLM's page (prometheus_client's ASGI app): `name[]` keeps only the samples named,
    which is how the gateway scrapes a vLLM kind of engine (METRICS_QUERY); without it, all."""
    before = parse_vllm_metrics(httpx.get(f"{v3.url}/metrics?{METRICS_QUERY}").text)
    httpx.post(v3.url + "/v1/completions", json=BODY)
    whole = httpx.get(v3.url + "/metrics").text
    part = httpx.get(f"{v3.url}/metrics?{METRICS_QUERY}").text
    names = {s.name for f in text_string_to_metric_families(part) for s in f.samples}
    assert names <= set(SERIES)
    assert {"vllm:num_requests_running", "vllm:inter_token_latency_seconds_sum",
            "vllm:prompt_tokens_total", "vllm:iteration_tokens_total_count"} <= names  # fmt: skip
    assert len(part) * 5 < len(whole)
    assert parse_vllm_metrics(part) == parse_vllm_metrics(whole)
    # A step for the prompt and its first token, one for each token after it (no drafts).
    steps = parse_vllm_metrics(part)[MODEL].steps
    earlier = before[MODEL].steps if MODEL in before else 0.0
    assert steps is not None
    assert steps - (earlier or 0.0) == BODY["max_tokens"]


def test_completion_fields(v3: SimProcess) -> None:
    r = httpx.post(v3.url + "/v1/completions", json=BODY | {"temperature": 0, "priority": 0})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["id"].startswith("cmpl-")
    assert (body["object"], body["model"]) == ("text_completion", MODEL)
    assert isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
    assert (choice["index"], choice["logprobs"], choice["finish_reason"]) == (0, None, "length")
    assert len(choice["text"].split()) == 12
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}


def test_completion_stream_framing_and_usage(v3: SimProcess) -> None:
    body = BODY | {"stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(v3.url + "/v1/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *text_chunks, usage = chunks
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
    assert {c["id"] for c in chunks} == {usage["id"]}
    for c in text_chunks:
        assert c["object"] == "text_completion"
        assert set(c["choices"][0]) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
    assert [c["choices"][0]["finish_reason"] for c in text_chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks[:-1])
    # The plain (v3) engine emits one token per step: one word per chunk.
    assert [len(c["choices"][0]["text"].split()) for c in text_chunks] == [1] * 12


def test_stream_without_usage_has_no_usage_chunk(v3: SimProcess) -> None:
    r = httpx.post(v3.url + "/v1/completions", json=BODY | {"stream": True})
    events = sse_events(r.text)
    assert all("usage" not in json.loads(e) for e in events[:-1])
    assert events[-1] == "[DONE]"


@pytest.mark.parametrize("engine", ["v3", "v4"])
def test_continuous_usage_counts_the_tokens_so_far(
    engine: str, request: pytest.FixtureRequest
) -> None:
    """As vLLM's `continuous_usage_stats`: each chunk's usage counts the tokens generated up to
    it (a speculative engine's chunk carries several), the last one the whole answer; the final
    usage chunk follows."""
    sim: SimProcess = request.getfixturevalue(engine)
    body = BODY | {"stream": True,
                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = [json.loads(e) for e in sse_events(httpx.post(sim.url + "/v1/completions",
                                                           json=body).text)[:-1]]  # fmt: skip
    *text_chunks, final = chunks
    so_far = [len(c["choices"][0]["text"].split()) for c in text_chunks]
    expected = [sum(so_far[: i + 1]) for i in range(len(so_far))]
    assert [c["usage"]["completion_tokens"] for c in text_chunks] == expected
    assert expected[-1] == 12
    assert all(c["usage"]["prompt_tokens"] == 5 for c in text_chunks)
    assert all(c["usage"]["total_tokens"] == 5 + c["usage"]["completion_tokens"]
               for c in text_chunks)  # fmt: skip
    assert final["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
    # Without include_usage, as in vLLM, no usage at all.
    body["stream_options"] = {"include_usage": False, "continuous_usage_stats": True}
    events = sse_events(httpx.post(sim.url + "/v1/completions", json=body).text)
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_continuous_usage_in_a_chat_stream_starts_at_zero(v3: SimProcess) -> None:
    msg = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 4,
           "ignore_eos": True, "stream": True,
           "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    text = httpx.post(v3.url + "/v1/chat/completions", json=msg).text
    chunks = [json.loads(e) for e in sse_events(text)[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["usage"]["completion_tokens"] for c in chunks] == [0, 1, 2, 3, 4, 4]


def test_chat_stream_and_non_stream(v3: SimProcess) -> None:
    msg = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 8,
           "ignore_eos": True}  # fmt: skip
    r = httpx.post(v3.url + "/v1/chat/completions", json=msg).json()
    assert r["object"] == "chat.completion"
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert len(r["choices"][0]["message"]["content"].split()) == 8
    assert r["usage"]["prompt_tokens"] == 2 + 4 + 3
    s = httpx.post(v3.url + "/v1/chat/completions", json=msg | {"stream": True}).text
    chunks = [json.loads(e) for e in sse_events(s)[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == r["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_openai_client(v3: SimProcess) -> None:
    client = openai.OpenAI(base_url=v3.url + "/v1", api_key="EMPTY")
    out = client.completions.create(model=MODEL, prompt="hello", max_tokens=5,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    assert out.usage is not None
    assert out.usage.completion_tokens == 5
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


def test_stop_and_min_tokens(v3: SimProcess) -> None:
    first = httpx.post(v3.url + "/v1/completions", json=BODY).json()["choices"][0]["text"]
    word = first.split()[3]
    r = httpx.post(v3.url + "/v1/completions", json=BODY | {"stop": [word]}).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["stop_reason"] == word
    assert word not in r["choices"][0]["text"]
    assert r["usage"]["completion_tokens"] <= 4
    natural = {"model": MODEL, "prompt": "x", "max_tokens": 3000, "min_tokens": 2500}
    r = httpx.post(v3.url + "/v1/completions", json=natural, timeout=30).json()
    assert r["usage"]["completion_tokens"] >= 2500


def test_side_endpoints(v3: SimProcess) -> None:
    assert httpx.get(v3.url + "/health").status_code == 200
    assert httpx.get(v3.url + "/health").content == b""
    assert httpx.get(v3.url + "/ping").status_code == 200
    assert "version" in httpx.get(v3.url + "/version").json()
    assert httpx.get(v3.url + "/load").json() == {"server_load": 0}
    models = httpx.get(v3.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["owned_by"] == "vllm"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (BODY | {"model": "nope"}, 404, "model"),
        (BODY | {"max_tokens": 5000}, 400, "max_tokens"),
        (BODY | {"max_tokens": 0}, 400, "max_tokens"),
        (BODY | {"temperature": -1}, 400, "temperature"),
        (BODY | {"stream_options": {"include_usage": True}}, 400, None),
        ({"model": MODEL}, 400, "prompt"),
        (BODY | {"n": 2}, 400, "n"),
        ([1, 2], 400, None),
    ],
)
def test_bad_input_gets_vllm_errors(
    v3: SimProcess, body: Any, status: int, param: str | None
) -> None:
    r = httpx.post(v3.url + "/v1/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert err["param"] == param
    assert err["message"]


def test_malformed_json(v3: SimProcess) -> None:
    r = httpx.post(v3.url + "/v1/completions", content=b"{not json",
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "BadRequestError"


def test_metrics_names_labels_buckets(v3: SimProcess) -> None:
    httpx.post(v3.url + "/v1/completions", json=BODY)
    fams = metrics(v3.url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
                 "vllm:num_preemptions", "vllm:cache_config_info"):  # fmt: skip
        assert name in fams, name
    labels = {"model_name": MODEL, "engine": "0"}
    assert sample(fams, "vllm:num_requests_running", **labels) == 0
    assert "vllm:spec_decode_num_drafts" not in fams  # no speculation on v3

    def buckets(name: str) -> list[float]:
        return [float(s.labels["le"]) for s in fams[name] if s.name == name + "_bucket"][:-1]

    assert buckets("vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS)
    assert buckets("vllm:inter_token_latency_seconds") == list(ITL_BUCKETS)
    assert buckets("vllm:e2e_request_latency_seconds") == list(REQUEST_BUCKETS)
    for reason in ("stop", "length", "abort", "error"):
        sample(fams, "vllm:request_success_total", finished_reason=reason, **labels)
    assert sample(fams, "vllm:generation_tokens_total", **labels) >= 12
    assert sample(fams, "vllm:request_success_total", finished_reason="length") >= 1


def test_queueing_shows_in_gauges() -> None:
    """16 requests to max_num_seqs=8: 8 running, 8 waiting."""
    with SimProcess(profile="v3", args=["--max-num-seqs", "8"]) as sim:

        async def fire() -> None:
            async with httpx.AsyncClient(timeout=60) as c:
                body = BODY | {"max_tokens": 200}
                tasks = [asyncio.create_task(c.post(sim.url + "/v1/completions", json=body))
                         for _ in range(16)]  # fmt: skip
                deadline = time.monotonic() + 10
                seen = (0.0, 0.0)
                while time.monotonic() < deadline and seen != (8.0, 8.0):
                    fams = {f.name: f.samples for f in text_string_to_metric_families(
                        (await c.get(sim.url + "/metrics")).text)}  # fmt: skip
                    seen = (sample(fams, "vllm:num_requests_running"),
                            sample(fams, "vllm:num_requests_waiting"))  # fmt: skip
                    await asyncio.sleep(0.05)
                assert seen == (8.0, 8.0)
                assert (await c.get(sim.url + "/load")).json()["server_load"] == 16
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(fire())


def test_preemption_when_kv_runs_out() -> None:
    with SimProcess(profile="v3", args=["--num-gpu-blocks", "40", "--speedup", "20"]) as sim:

        async def fire() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as c:
                body = BODY | {"max_tokens": 200}
                rs = await asyncio.gather(*(c.post(sim.url + "/v1/completions", json=body)
                                            for _ in range(6)))  # fmt: skip
                return [r.json()["usage"]["completion_tokens"] for r in rs]

        assert asyncio.run(fire()) == [200] * 6
        assert sample(metrics(sim.url), "vllm:num_preemptions_total") > 0


def test_speculative_chunks_carry_several_tokens(v4: SimProcess) -> None:
    body = BODY | {"max_tokens": 200, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(httpx.post(v4.url + "/v1/completions", json=body, timeout=30).text)
    chunks = [json.loads(e) for e in events[:-1]]
    sizes = [len(c["choices"][0]["text"].split()) for c in chunks if c["choices"]]
    assert sum(sizes) == 200 == chunks[-1]["usage"]["completion_tokens"]
    assert max(sizes) == 6
    assert min(sizes) >= 1
    assert len(sizes) < 100
    fams = metrics(v4.url)
    drafts = sample(fams, "vllm:spec_decode_num_drafts_total")
    draft_tokens = sample(fams, "vllm:spec_decode_num_draft_tokens_total")
    accepted = sample(fams, "vllm:spec_decode_num_accepted_tokens_total")
    assert draft_tokens == 5 * drafts
    assert 0 < accepted < draft_tokens
    per_pos = [sample(fams, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(5)]  # fmt: skip
    assert sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)


def test_api_key() -> None:
    with SimProcess(profile="instant", args=["--api-key", "sekret"]) as sim:
        r = httpx.post(sim.url + "/v1/completions", json=BODY)
        assert r.status_code == 401
        ok = httpx.post(sim.url + "/v1/completions", json=BODY,
                        headers={"authorization": "Bearer sekret"})  # fmt: skip
        assert ok.status_code == 200
        assert httpx.get(sim.url + "/health").status_code == 200  # only /v1 is guarded


def test_fault_headers(v3: SimProcess) -> None:
    url = v3.url + "/v1/completions"
    r = httpx.post(url, json=BODY, headers={"x-sim-fault": "error"})
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "InternalServerError"
    events = sse_events(httpx.post(url, json=BODY | {"stream": True},
                                   headers={"x-sim-fault": "error-mid"}).text)  # fmt: skip
    assert events[-1] == "[DONE]"
    assert "error" in json.loads(events[-2])
    assert "choices" in json.loads(events[0])
    t0 = time.perf_counter()
    httpx.post(url, json=BODY, headers={"x-sim-fault": "slow=0.5"})
    assert time.perf_counter() - t0 >= 0.5
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=BODY, headers={"x-sim-fault": "hang"}, timeout=0.5)


def test_runtime_faults_and_crash() -> None:
    with SimProcess(profile="instant") as sim:
        r = httpx.post(sim.url + "/sim/faults", json={"unhealthy": True, "error_rate": 1.0})
        assert r.json()["unhealthy"] is True
        assert httpx.get(sim.url + "/health").status_code == 503
        assert httpx.post(sim.url + "/v1/completions", json=BODY).status_code == 500
        bad = httpx.post(sim.url + "/sim/faults", json={"error_rate": 7})
        assert bad.status_code == 400
        with pytest.raises(httpx.TransportError):
            httpx.post(sim.url + "/v1/completions", json=BODY, headers={"x-sim-fault": "crash"})
        assert sim.proc is not None
        assert sim.proc.wait(5) != 0


def test_crash_after_flag() -> None:
    with SimProcess(profile="instant", args=["--fault-crash-after", "2"]) as sim:
        assert httpx.post(sim.url + "/v1/completions", json=BODY).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.post(sim.url + "/v1/completions", json=BODY)
        assert sim.proc is not None
        assert sim.proc.wait(5) != 0


def test_client_disconnect_aborts(v3: SimProcess) -> None:
    body = BODY | {"max_tokens": 3000, "stream": True}
    with httpx.stream("POST", v3.url + "/v1/completions", json=body) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        fams = metrics(v3.url)
        if sample(fams, "vllm:request_success_total", finished_reason="abort") >= 1:
            break
        time.sleep(0.05)
    assert sample(fams, "vllm:request_success_total", finished_reason="abort") >= 1
    assert sample(fams, "vllm:num_requests_running") == 0
