"""The simulator's automatic prefix caching over real sockets: a repeated long prompt comes back
sooner, a chat's next turn reuses the previous answer too, and vLLM's prefix-cache counters and
usage details say how many tokens were reused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtests.harness.procs import SimProcess

MODEL = "meta-llama/Llama-2-7b-chat-hf"
# 3000 one-word tokens: 300 ms of prefill on v3 (0.1 ms a token), 150 ms at --speedup 2.
LONG = " ".join(f"w{i}" for i in range(3000))
CACHED = (3000 - 1) // 16 * 16  # vLLM always computes the last token: 187 blocks


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess(profile="v3", args=["--speedup", "2", "--prefix-caching"]) as s:
        yield s


@pytest.fixture(scope="module")
def sim_off() -> Iterator[SimProcess]:
    with SimProcess(profile="v3", args=["--speedup", "20", "--no-prefix-caching"]) as s:
        yield s


def prefix_counters(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                assert s.labels == {"model_name": MODEL, "engine": "0"}
                out[s.name.removeprefix("vllm:prefix_cache_").removesuffix("_total")] = s.value
    return out


def complete(url: str, prompt: str) -> tuple[float, dict[str, Any]]:
    """One token (so the elapsed time is the TTFT plus the HTTP round trip) and its usage."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "ignore_eos": True}
    start = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    elapsed = time.perf_counter() - start
    assert r.status_code == 200, r.text
    usage: dict[str, Any] = r.json()["usage"]
    return elapsed, usage


def test_a_repeated_long_prompt_prefills_only_its_uncached_tail(sim: SimProcess) -> None:
    assert prefix_counters(sim.url) == {"queries": 0, "hits": 0}
    cold, cold_usage = complete(sim.url, LONG)
    warm, warm_usage = complete(sim.url, LONG)
    assert "prompt_tokens_details" not in cold_usage
    assert warm_usage["prompt_tokens_details"] == {"cached_tokens": CACHED}
    assert warm_usage["prompt_tokens"] == 3000
    # The cold request paid ~150 ms more prefill (front end ~80 ms both times).
    assert warm < cold - 0.08, (cold, warm)
    assert prefix_counters(sim.url) == {"queries": 6000, "hits": CACHED}
    # Same first 1000 words, then different: only the shared blocks hit (1000 // 16 = 62).
    other = " ".join(LONG.split()[:1000] + [f"x{i}" for i in range(500)])
    _, usage = complete(sim.url, other)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 62 * 16}
    # A different first word: nothing after it is shared.
    _, usage = complete(sim.url, "different " + LONG)
    assert "prompt_tokens_details" not in usage
    assert prefix_counters(sim.url) == {"queries": 6000 + 1500 + 3001, "hits": CACHED + 992}


def test_chats_sharing_a_system_prompt_hit_its_blocks(sim: SimProcess) -> None:
    system = {"role": "system", "content": " ".join(f"s{i}" for i in range(100))}

    def chat(question: str) -> dict[str, Any]:
        body = {"model": MODEL, "max_tokens": 1, "messages": [system,
                {"role": "user", "content": question}]}  # fmt: skip
        r = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        usage: dict[str, Any] = r.json()["usage"]
        return usage

    chat("what is a prefix cache")
    usage = chat("and a block")
    # The system message renders to 104 tokens, then "<|start|> user <|sep|> ...": 6 full
    # blocks (96 tokens) are the system prompt's alone.
    assert usage["prompt_tokens_details"] == {"cached_tokens": 96}


def test_a_chat_s_next_turn_hits_the_previous_answer(sim: SimProcess) -> None:
    messages = [
        {"role": "system", "content": " ".join(f"t{i}" for i in range(100))},  # 104 tokens
        {"role": "user", "content": " ".join(f"u{i}" for i in range(20))},  # 24
    ]

    def chat() -> tuple[str, dict[str, Any]]:
        body = {"model": MODEL, "max_tokens": 40, "ignore_eos": True, "messages": messages}
        r = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        answer: str = r.json()["choices"][0]["message"]["content"]
        return answer, r.json()["usage"]

    answer, usage = chat()
    assert usage["prompt_tokens"] == 104 + 24 + 3
    assert "prompt_tokens_details" not in usage
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    _, usage = chat()
    assert usage["prompt_tokens"] == 104 + 24 + (40 + 4) + (1 + 4) + 3
    # Prompt and answer: 171 tokens, of which the engine computed 170 (never its last token's
    # KV), so 10 full blocks; the prompt alone would have given 8.
    assert usage["prompt_tokens_details"] == {"cached_tokens": 160}


def test_no_prefix_caching_reuses_nothing(sim_off: SimProcess) -> None:
    complete(sim_off.url, LONG)
    _, usage = complete(sim_off.url, LONG)
    assert "prompt_tokens_details" not in usage
    assert prefix_counters(sim_off.url) == {"queries": 0, "hits": 0}
