"""engines/hf's server over a real socket, with a pure-Python generator in place of the model
(torch and a GPU are not here; the real generator is run on a GPU: engines/hf/README.md). The
official `openai` client and httpx talk to it; checked: vLLM's API shapes, serial generation
with queue gauges, aborts on disconnect, errors, metrics."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
import yaml
from prometheus_client.parser import text_string_to_metric_families

from engines.hf.model import WordTokenizer
from engines.hf.probe import probe
from engines.hf.server import HFConfig, create_app
from loadtests.harness.procs import GatewayProcess, free_port, wait_http
from tests.integration.stack import wait_until_async

MODEL = "meta-llama/Llama-2-7b-chat-hf"
STEP_S = 0.01
EOS_AFTER = 5  # the fake model ends its answer after this many tokens unless ignore_eos


class FakeGenerator:
    """Greedy 'model': token i of a reply is 100 + i, one every STEP_S seconds."""

    max_model_len = 64

    def __init__(self) -> None:
        self.words = WordTokenizer(32000)
        self.active = 0
        self.max_active = 0
        self.calls: list[int] = []
        self.spans: list[tuple[float, float]] = []  # each generation's (start, end), monotonic

    def encode(self, text: str) -> list[int]:
        return self.words.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.words.decode(ids)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        if any(m["role"] == "tool" for m in messages):
            raise ValueError("This model's chat template has no tool role.")
        return [*self.encode(" ".join(m["content"] for m in messages)), 1, 2]

    def generate(self, prompt: list[int], max_tokens: int, ignore_eos: bool,
                 on_token: Callable[[int], None]) -> str:  # fmt: skip
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.calls.append(len(prompt))
        start = time.monotonic()
        try:
            if prompt == self.encode("boom"):
                on_token(7)
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            n = max_tokens if ignore_eos else min(max_tokens, EOS_AFTER)
            for i in range(n):
                time.sleep(STEP_S)
                on_token(100 + i)
            return "length" if n == max_tokens else "stop"
        finally:
            self.active -= 1
            self.spans.append((start, time.monotonic()))


class Server:
    def __init__(self, gen: FakeGenerator) -> None:
        self.gen = gen
        self.port = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(HFConfig(gen, MODEL)), host="127.0.0.1",
                                port=self.port, log_level="warning")  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        wait_http(self.url + "/health", 10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(FakeGenerator()) as s:
        yield s


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics").text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    wanted = labels.items()
    return sum(s.value for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in wanted))  # fmt: skip


def test_openai_client_streaming_and_not(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    r = client.completions.create(model=MODEL, prompt="one two three", max_tokens=8,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    assert r.choices[0].text == "".join(f" w{100 + i}" for i in range(8))
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 8)
    # Without ignore_eos the model stops by itself: finish_reason "stop".
    r = client.completions.create(model=MODEL, prompt="one", max_tokens=8)
    assert (r.choices[0].finish_reason, r.usage and r.usage.completion_tokens) == ("stop", 5)
    stream = client.completions.create(model=MODEL, prompt="one two", max_tokens=6, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})  # fmt: skip
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == "".join(f" w{100 + i}" for i in range(6))
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6


def test_chat_uses_the_template_and_reports_its_absence(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    hello = [{"role": "user", "content": "hi there"}]
    r = client.chat.completions.create(model=MODEL, max_tokens=3, messages=hello)
    assert r.choices[0].message.content == " w100 w101 w102"
    assert r.usage is not None
    assert r.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=3,
                                       messages=[{"role": "tool", "content": "x",
                                                  "tool_call_id": "1"}])  # fmt: skip
    assert "tool role" in str(e.value)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "other", "prompt": "a"}, 404, "model"),
        ({"model": MODEL, "prompt": "a", "max_tokens": 100}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": " ".join(["w"] * 64)}, 400, "prompt"),
        ({"model": MODEL, "prompt": "a", "n": 2}, 400, "n"),
        ({"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
        ({"model": MODEL}, 400, "prompt"),
    ],
)
def test_client_mistakes_get_vllm_errors(server: Server, body: dict[str, object], status: int,
                                         param: str) -> None:  # fmt: skip
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == status
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["code"] == status


def test_requests_run_one_at_a_time_and_the_queue_is_visible(server: Server) -> None:
    async def run() -> list[float]:
        async with httpx.AsyncClient(timeout=30) as client:

            async def one() -> float:
                await client.post(server.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "a b", "max_tokens": 20, "ignore_eos": True})
                return time.monotonic()

            tasks = [asyncio.create_task(one()) for _ in range(4)]
            # Until all four have arrived (0.1 s on a quiet machine; longer on a busy one).
            deadline = time.monotonic() + 5
            while True:
                await asyncio.sleep(0.05)
                waiting = metric(server.url, "vllm:num_requests_waiting")
                running = metric(server.url, "vllm:num_requests_running")
                if running + waiting >= 4 or time.monotonic() > deadline:
                    break
            assert (running, waiting) == (1, 3)
            # The token counter moves during a generation, not only at its end (a router
            # watching it for hung engines must see a slow one progress): it is seen past
            # `before` at a count that is not a whole number of 20-token generations.
            before = metric(server.url, "vllm:generation_tokens_total")

            def moved_mid_generation() -> bool:
                now = metric(server.url, "vllm:generation_tokens_total")
                return now > before and now % 20 != 0

            # Read off the event loop, which must go on receiving the answers as they end.
            await wait_until_async(lambda: asyncio.to_thread(moved_mid_generation),
                                   "the token counter moving mid-generation")  # fmt: skip
            return list(await asyncio.gather(*tasks))

    first = len(server.gen.spans)
    asyncio.run(run())
    assert server.gen.max_active == 1  # batch 1, as the tutorial's v0/v1
    # Serial, as the engine ran them: each generation starts once the one before has ended.
    # (Read on the engine's side: a busy client reads the answers' ends bunched together.)
    spans = sorted(server.gen.spans[first:])
    assert len(spans) == 4
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans))
    assert all(end - start >= 20 * STEP_S for start, end in spans)
    assert metric(server.url, "vllm:request_success_total", finished_reason="length") == 4
    assert metric(server.url, "vllm:generation_tokens_total") == 80
    assert metric(server.url, "vllm:time_to_first_token_seconds_count") == 4


def test_a_client_that_leaves_stops_the_generation(server: Server) -> None:
    with httpx.stream("POST", server.url + "/v1/completions", json={
            "model": MODEL, "prompt": "a", "max_tokens": 60, "ignore_eos": True,
            "stream": True}) as r:  # fmt: skip
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    deadline = time.monotonic() + 5
    while metric(server.url, "vllm:request_success_total", finished_reason="abort") < 1:
        assert time.monotonic() < deadline, "the generation was not aborted"
        time.sleep(0.05)
    assert server.gen.active == 0
    # The next request is served at once: the aborted one let go of the model.
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "b",
                                                         "max_tokens": 2})  # fmt: skip
    assert r.status_code == 200


def test_a_failing_generation_is_reported_and_frees_the_model(server: Server) -> None:
    boom = {"model": MODEL, "prompt": "boom", "max_tokens": 4}
    r = httpx.post(server.url + "/v1/completions", json=boom)
    assert r.status_code == 500
    assert "illegal memory access" in r.json()["error"]["message"]
    # Streamed, the failure comes after the first token: vLLM's error event, then [DONE].
    r = httpx.post(server.url + "/v1/completions", json=boom | {"stream": True})
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "error" in events[-2]
    assert metric(server.url, "vllm:request_success_total", finished_reason="error") == 2
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "a",
                                                         "max_tokens": 2})  # fmt: skip
    assert r.status_code == 200


def test_models_and_health(server: Server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    assert "sdpa" in httpx.get(server.url + "/version").json()["version"]
    data = httpx.get(server.url + "/v1/models").json()["data"]
    assert [m["id"] for m in data] == [MODEL]


def test_the_gateway_routes_to_it_as_to_any_vllm_tier(server: Server, tmp_path: Path) -> None:
    config = tmp_path / "tiers.yaml"
    config.write_text(yaml.safe_dump({"tiers": [{"name": "hf", "role": "throughput",
                                                 "backends": [{"url": server.url,
                                                               "models": [MODEL]}]}]}))  # fmt: skip
    with GatewayProcess(config=config, log=tmp_path / "gateway.log") as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x")
        stream = client.completions.create(model=MODEL, prompt="one two", max_tokens=30,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})  # fmt: skip
        chunks = list(stream)
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 30
        state = httpx.get(gw.url + "/state").json()
        (backend,) = state["backends"]
        assert backend["url"] == server.url
        assert backend["healthy"]


def test_the_gpu_probe_against_the_server(server: Server) -> None:
    # engines/hf/probe.py is what produced docs/results/hf-h200.md's HTTP table on a GPU;
    # here its client side runs against the pure-Python generator.
    server.gen.max_model_len = 512  # room for the probe's 50-word prompt and 60 tokens
    out = probe(server.url, 2, model=MODEL, long=10, short=60)
    assert [r["chunks"] for r in out["single"]] == [10, 10]
    assert out["single"][0]["usage"]["completion_tokens"] == 10
    assert out["single_median"]["tpot_ms"] >= STEP_S * 1000 * 0.5
    assert len(out["four_concurrent_e2e_s"]) == 4
    assert any(line.endswith(" 3.0") for line in out["gauges_during"])
    assert out["non_streamed"]["usage"]["completion_tokens"] == 5
