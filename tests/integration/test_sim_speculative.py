"""The simulator's speculative acceptance as a variable, over real sockets: /sim/speculative, the
x-sim-acceptance header, --acceptance, and vLLM's spec_decode counters following the vector."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engines.sim.profile import Speculative, load_profile, mean_tokens_per_step
from loadtests.harness.procs import SimProcess

MODEL = "meta-llama/Llama-2-7b-chat-hf"
BODY = {"model": MODEL, "prompt": "one two three four five", "max_tokens": 40, "ignore_eos": True}
V4 = load_profile("v4").speculative or Speculative(acceptance=())
LOW = [0.45, 0.35, 0.3, 0.25, 0.2]
ZEROS, ONES = [0.0] * 5, [1.0] * 5


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(profile="v4", args=["--speedup", "20"]) as s:
        yield s


@pytest.fixture
def v4(sim: SimProcess) -> Iterator[SimProcess]:
    """The module's v4 simulator, its vector back to the profile's after each test."""
    yield sim
    assert httpx.post(sim.url + "/sim/speculative", json={"scale": 1}).status_code == 200


def spec_counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    names = ("drafts", "draft_tokens", "accepted_tokens")
    samples = {s.name: s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples}  # fmt: skip
    return {n: samples[f"vllm:spec_decode_num_{n}_total"] for n in names}


def chunk_sizes(url: str, headers: dict[str, str] | None = None, max_tokens: int = 40) -> list[int]:
    """Tokens per streamed chunk (one chunk per engine step, one word per token)."""
    body = BODY | {"stream": True, "max_tokens": max_tokens}
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    events = r.text.split("\n\n")[:-1]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    sizes = [len(c["choices"][0]["text"].split()) for c in chunks]
    assert sum(sizes) == max_tokens
    return sizes


def fire(url: str, n: int, max_tokens: int) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            body = BODY | {"max_tokens": max_tokens}
            rs = await asyncio.gather(*(c.post(url + "/v1/completions", json=body)
                                        for _ in range(n)))  # fmt: skip
            assert all(r.status_code == 200 for r in rs)

    asyncio.run(run())


def assert_vllm_error(r: httpx.Response, param: str | None = None) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["code"], err["param"]) == ("BadRequestError", 400, param)
    message: str = err["message"]
    assert message
    return message


def test_get_shows_the_profiles_vector(v4: SimProcess) -> None:
    r = httpx.get(v4.url + "/sim/speculative")
    assert r.status_code == 200
    assert r.json() == {
        "acceptance": list(V4.acceptance),
        "num_speculative_tokens": 5,
        "mean_tokens_per_step": pytest.approx(3.2568),
    }


def test_post_vector_and_scale(v4: SimProcess) -> None:
    r = httpx.post(v4.url + "/sim/speculative", json={"acceptance": LOW})
    assert r.status_code == 200
    assert r.json()["acceptance"] == LOW
    assert r.json()["mean_tokens_per_step"] == pytest.approx(mean_tokens_per_step(LOW))
    assert httpx.get(v4.url + "/sim/speculative").json()["acceptance"] == LOW
    # A scale is relative to the starting vector, not to the current one, and clamped to 1.
    r = httpx.post(v4.url + "/sim/speculative", json={"scale": 1.25})
    assert r.json()["acceptance"] == pytest.approx([1.0, 0.9375, 0.875, 0.8125, 0.75])
    r = httpx.post(v4.url + "/sim/speculative", json={"scale": 0})
    assert r.json() == {"acceptance": ZEROS, "num_speculative_tokens": 5,
                        "mean_tokens_per_step": 1.0}  # fmt: skip


def test_steps_follow_the_posted_vector(v4: SimProcess) -> None:
    httpx.post(v4.url + "/sim/speculative", json={"acceptance": ZEROS})
    assert chunk_sizes(v4.url) == [1] * 40
    httpx.post(v4.url + "/sim/speculative", json={"acceptance": ONES})
    assert chunk_sizes(v4.url) == [1] + [6] * 6 + [3]
    before = spec_counters(v4.url)
    chunk_sizes(v4.url, max_tokens=31)
    after = spec_counters(v4.url)
    delta = {k: after[k] - before[k] for k in before}
    assert delta == {"drafts": 5, "draft_tokens": 25, "accepted_tokens": 25}


def test_spec_decode_counters_follow_a_low_vector(v4: SimProcess) -> None:
    before = spec_counters(v4.url)
    r = httpx.post(v4.url + "/sim/speculative", json={"acceptance": LOW})
    assert r.status_code == 200
    fire(v4.url, n=8, max_tokens=300)
    after = spec_counters(v4.url)
    drafts = after["drafts"] - before["drafts"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    assert draft_tokens == 5 * drafts
    assert drafts > 1000
    # Accepted drafts per step: mean m - 1, variance from P(X >= j) = a0 * ... * a(j-1).
    tail, run = [], 1.0
    for a in LOW:
        run *= a
        tail.append(run)
    mean = sum(tail)
    var = sum((2 * j + 1) * p for j, p in enumerate(tail)) - mean**2
    assert mean == pytest.approx(mean_tokens_per_step(LOW) - 1)
    per_step = accepted / drafts
    assert abs(per_step - mean) < 4 * math.sqrt(var / drafts)
    # The profile's vector accepts 0.45 of the draft tokens; this one 0.134.
    assert accepted / draft_tokens < 0.2


def test_request_header_sets_that_sequence_only(v4: SimProcess) -> None:
    httpx.post(v4.url + "/sim/speculative", json={"acceptance": ONES})
    assert chunk_sizes(v4.url, {"x-sim-acceptance": "0,0,0,0,0"}) == [1] * 40
    assert chunk_sizes(v4.url, {"x-sim-acceptance": "0"}) == [1] * 40  # a scale
    httpx.post(v4.url + "/sim/speculative", json={"acceptance": ZEROS})
    assert chunk_sizes(v4.url, {"x-sim-acceptance": "1, 1, 1, 1, 1"}) == [1] + [6] * 6 + [3]
    # The scale of a header is relative to the starting vector too (x2 clamps it to all ones).
    assert chunk_sizes(v4.url, {"x-sim-acceptance": "2"}) == [1] + [6] * 6 + [3]
    assert chunk_sizes(v4.url) == [1] * 40  # the engine's vector is untouched


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"acceptance": [0.5] * 4}, "acceptance"),
        ({"acceptance": [0.5] * 6}, "acceptance"),
        ({"acceptance": [0.5, 0.5, 0.5, 0.5, 1.5]}, "acceptance.4"),
        ({"acceptance": "0.5"}, "acceptance"),
        ({"scale": -1}, "scale"),
        ({}, None),
        ({"acceptance": LOW, "scale": 1}, None),
        ({"acceptance": LOW, "extra": 1}, "extra"),
        ([0.5] * 5, None),
    ],
)
def test_bad_posts_are_400_and_change_nothing(v4: SimProcess, body: Any, param: str | None) -> None:
    r = httpx.post(v4.url + "/sim/speculative", json=body)
    assert_vllm_error(r, param)
    assert httpx.get(v4.url + "/sim/speculative").json()["acceptance"] == list(V4.acceptance)


def test_malformed_json_and_bad_headers(v4: SimProcess) -> None:
    r = httpx.post(v4.url + "/sim/speculative", content=b"{nope",
                   headers={"content-type": "application/json"})  # fmt: skip
    assert "Invalid JSON" in assert_vllm_error(r)
    for header in ("0.5,0.4", "0.5,0.4,0.3,0.2,7", "a,b,c,d,e", "-1", "inf", ""):
        r = httpx.post(v4.url + "/v1/completions", json=BODY, headers={"x-sim-acceptance": header})
        assert "x-sim-acceptance" in assert_vllm_error(r), header


def test_engine_without_speculation_refuses() -> None:
    with SimProcess(profile="instant") as sim:
        for r in (httpx.get(sim.url + "/sim/speculative"),
                  httpx.post(sim.url + "/sim/speculative", json={"scale": 1})):  # fmt: skip
            assert "speculative" in assert_vllm_error(r)
        r = httpx.post(sim.url + "/v1/completions", json=BODY, headers={"x-sim-acceptance": "1"})
        assert "x-sim-acceptance" in assert_vllm_error(r)
        assert httpx.post(sim.url + "/v1/completions", json=BODY).status_code == 200


def test_acceptance_flag_replaces_the_profiles_vector() -> None:
    args = ["--speedup", "20", "--acceptance", "0.5,0.4,0.3,0.2,0"]
    with SimProcess(profile="v4", args=args) as sim:
        r = httpx.get(sim.url + "/sim/speculative").json()
        assert r["acceptance"] == [0.5, 0.4, 0.3, 0.2, 0.0]
        assert max(chunk_sizes(sim.url, max_tokens=200)) <= 5  # the last draft never passes
        # Scales are relative to the vector the simulator started with.
        r = httpx.post(sim.url + "/sim/speculative", json={"scale": 2}).json()
        assert r["acceptance"] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.0])


@pytest.mark.parametrize(
    ("profile", "value", "says"),
    [
        ("v4", "0.5,0.4", "5 comma-separated probabilities needed, got 2"),
        ("v4", "0.5,0.4,0.3,0.2,1.1", "within 0..1"),
        ("v4", "0.5,x,0.3,0.2,0.1", "could not convert"),
        ("v3", "0.5,0.4,0.3,0.2,0.1", "does not use speculative decoding"),
    ],
)
def test_acceptance_flag_validation(profile: str, value: str, says: str) -> None:
    cmd = [sys.executable, "-m", "tiergate", "sim", "--profile", profile, "--port", "9",
           "--acceptance", value]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 2
    err = " ".join(r.stderr.replace("│", " ").split())  # typer boxes and wraps the message
    assert "--acceptance" in err
    assert says in err
