"""Faults in real simulator processes behind a real gateway: what the clients see, and how the
gateway takes the faulty engine out of rotation and brings it back (gateway.backends.outlier,
gateway.pipeline.watchdog)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtests.harness.procs import SimProcess
from tests.integration.stack import MODEL, Stack, add_gateway, start_stack, wait_until_async

# Bounds on time and placement: run after the parallel tests, alone (scripts/test).
pytestmark = pytest.mark.serial

BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 8,
                        "ignore_eos": True}  # fmt: skip
# Short ejections, so a test sees a backend go out, come back on probation, and go out again.
FAST_OUTLIER = {"base_ejection_s": 1.0, "max_ejection_s": 8.0}


def metric(url: str, family: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(
        s.value
        for f in text_string_to_metric_families(text) if f.name == family
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )  # fmt: skip


def backend_view(stack: Stack, url: str) -> dict[str, Any]:
    (view,) = [b for b in httpx.get(stack.gateway.url + "/state").json()["backends"]
               if b["url"] == url]  # fmt: skip
    return dict(view)


async def _load(url: str, n: int, concurrency: int, tier: str | None) -> list[httpx.Response]:
    """`n` requests, `concurrency` at a time, pinned to `tier` if given."""
    gate = asyncio.Semaphore(concurrency)
    headers = {"x-tiergate-tier": tier} if tier else {}
    async with httpx.AsyncClient(timeout=30) as c:

        async def one() -> httpx.Response:
            async with gate:
                return await c.post(url + "/v1/completions", json=BODY, headers=headers)

        return list(await asyncio.gather(*(one() for _ in range(n))))


def load(
    stack: Stack, n: int = 60, concurrency: int = 8, tier: str | None = "throughput"
) -> list[httpx.Response]:
    """Short requests, on the throughput pool unless told otherwise (where the faulty engine
    is: unpinned, the latency tier would take most of such light load)."""
    return asyncio.run(_load(stack.gateway.url, n, concurrency, tier))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = start_stack(tmp_path, latency=1, throughput=2, speedup=10, outlier=FAST_OUTLIER)
    yield s
    s.stop()


def test_an_engine_failing_half_its_requests_costs_the_clients_nothing(stack: Stack) -> None:
    bad = stack.throughput[0]
    httpx.post(bad.url + "/sim/faults", json={"error_rate": 0.5}).raise_for_status()
    responses = load(stack, n=80, concurrency=12)
    assert [r.status_code for r in responses] == [200] * 80
    gw = stack.gateway.url
    failed = metric(gw, "tiergate_attempts", "tiergate_attempts_total", backend=bad.url,
                    outcome="http_500")  # fmt: skip
    assert failed >= 1
    assert metric(gw, "tiergate_backend_ejections", "tiergate_backend_ejections_total",
                  backend=bad.url, reason="requests") >= 1  # fmt: skip
    # A retry is counted when the next attempt starts: never more than the failed attempts
    # (500s, and attempts that were waiting there when it was ejected)
    attempts = metric(gw, "tiergate_attempts", "tiergate_attempts_total", backend=bad.url)
    ok = metric(gw, "tiergate_attempts", "tiergate_attempts_total", backend=bad.url, outcome="ok")
    assert 1 <= metric(gw, "tiergate_retries", "tiergate_retries_total", backend=bad.url) <= (
        attempts - ok)  # fmt: skip


def test_a_stream_whose_first_event_is_an_error_is_retried_elsewhere(stack: Stack) -> None:
    """vLLM reports a failure after its status line as an error event: when that is all a
    stream has sent, nothing reached the client yet, and another engine can answer."""
    bad = stack.throughput[0]
    httpx.post(bad.url + "/sim/faults", json={"error_rate": 1.0, "error_status": 503})

    async def run() -> list[tuple[int, str]]:
        body = BODY | {"stream": True}
        async with httpx.AsyncClient(timeout=30) as c:

            async def one() -> tuple[int, str]:
                r = await c.post(stack.gateway.url + "/v1/completions", json=body,
                                 headers={"x-tiergate-tier": "throughput"})  # fmt: skip
                return r.status_code, r.text

            return list(await asyncio.gather(*(one() for _ in range(12))))

    for status, text in asyncio.run(run()):
        assert status == 200
        assert text.endswith("data: [DONE]\n\n")
        assert '"error"' not in text
    gw = stack.gateway.url
    assert metric(gw, "tiergate_attempts", "tiergate_attempts_total", backend=bad.url,
                  outcome="event_503") >= 1  # fmt: skip
    assert backend_view(stack, bad.url)["ejected_reason"] == "requests_event_503"


def test_an_engine_refusing_work_while_healthy_stays_out_on_a_growing_backoff(
    stack: Stack,
) -> None:
    """503 to every request, 200 on /health: probes do not bring it back, probation does, and
    each failed probation keeps it out longer (1, 2, 3 s ...), instead of flapping."""
    bad = stack.throughput[0]
    httpx.post(bad.url + "/sim/faults", json={"error_rate": 1.0, "error_status": 503})
    t0 = time.monotonic()
    statuses: list[int] = []
    while time.monotonic() - t0 < 6:
        statuses += [r.status_code for r in load(stack, n=16, concurrency=4)]
    assert set(statuses) == {200}
    ejections = metric(stack.gateway.url, "tiergate_backend_ejections",
                       "tiergate_backend_ejections_total", backend=bad.url)  # fmt: skip
    # out at once, then back for one trial request after 1 s, 2 s, 3 s: 3 or 4 in 6 s, where
    # re-admission by probe (every 0.5 s here) would make about 12
    assert 1 <= ejections <= 4
    view = backend_view(stack, bad.url)
    assert view["ejected_reason"] == "requests_http_503" or view["probation"]


def test_credentials_the_engine_refuses_are_the_gateways_fault(tmp_path: Path) -> None:
    """An engine that wants a key the gateway does not send: the clients are served by the
    others, the engine is ejected, the log says so once; alone, it is a 502 that says why."""
    stack = Stack([], [])
    try:
        stack.throughput += [
            SimProcess(profile="v3", args=["--speedup", "10", "--api-key", "engine-key"]).start(),
            SimProcess(profile="v3", args=["--speedup", "10"]).start(),
        ]
        gw = add_gateway(stack, tmp_path, outlier=FAST_OUTLIER)
        locked = stack.throughput[0].url
        responses = load(stack, n=40, concurrency=4)
        assert [r.status_code for r in responses] == [200] * 40
        assert {r.headers["x-tiergate-backend"] for r in responses} == {stack.throughput[1].url}
        assert metric(gw.url, "tiergate_attempts", "tiergate_attempts_total", backend=locked,
                      outcome="auth") >= 1  # fmt: skip
        stack.throughput[1].kill()  # the locked engine alone: once both are seen so
        deadline = time.monotonic() + 15

        def alone() -> bool:
            return (backend_view(stack, stack.throughput[1].url)["ejected_reason"] is not None
                    and backend_view(stack, locked)["ejected_reason"] is None)  # fmt: skip

        while not alone() and time.monotonic() < deadline:
            time.sleep(0.1)
        r = httpx.post(gw.url + "/v1/completions", json=BODY)
        assert r.status_code == 502
        error = r.json()["error"]
        assert "refused the gateway's credentials" in error["message"]
        assert error["type"] == "BadGatewayError"
    finally:
        stack.stop()
    log = (tmp_path / "gateway.log").read_text()
    ejected = [
        line for line in log.splitlines()
        if "backend ejected" in line and locked in line and "requests_auth" in line
    ]  # fmt: skip
    assert len(ejected) == 1, ejected  # once, though it was ejected again on probation


async def _streams(
    stack: Stack, n: int, fault: Any, body: dict[str, Any], path: str = "/v1/completions"
) -> list[tuple[str, float, str]]:
    """`n` streams at once; once every one has had its first text, `fault()`. Per stream: the
    backend that started it, the longest silence the client saw (s), and everything it
    received."""
    started = 0
    async with httpx.AsyncClient(timeout=60) as c:

        async def stream() -> tuple[str, float, str]:
            nonlocal started
            async with c.stream("POST", stack.gateway.url + path, json=body) as r:
                text, last, gap = "", time.monotonic(), 0.0
                async for chunk in r.aiter_text():
                    now = time.monotonic()
                    if chunk and not text:
                        started += 1
                    text, gap, last = text + chunk, max(gap, now - last), now
                return r.headers["x-tiergate-backend"], gap, text

        tasks = [asyncio.create_task(stream()) for _ in range(n)]
        await wait_until_async(lambda: started == n or any(t.done() for t in tasks),
                               f"all {n} streams under way")  # fmt: skip
        fault()
        return list(await asyncio.gather(*tasks))


def _events(text: str) -> list[Any]:
    assert text.endswith("data: [DONE]\n\n"), text[-300:]
    return [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]


def check_whole(text: str, tokens: int, chat: bool = False) -> None:
    """One unbroken stream: no error, one id, `tokens` pieces of text (one per token on a
    plain engine), and a usage that counts them."""
    events = _events(text)
    assert not [e for e in events if "error" in e]
    assert len({e["id"] for e in events}) == 1
    key = "delta" if chat else "text"
    pieces = [c for e in events for c in e["choices"]
              if (c[key].get("content") if chat else c[key])]  # fmt: skip
    assert len(pieces) == tokens
    assert events[-1]["usage"]["completion_tokens"] == tokens
    if chat:
        assert sum("role" in c["delta"] for e in events for c in e["choices"]) == 1


# ~4 s at 4x: the fault once every stream is under way (and a frozen engine's 2.5 s idle
# timeout) comes mid-way.
STREAM_TOKENS = 1000
STREAM = BODY | {"max_tokens": STREAM_TOKENS, "stream": True,
                 "stream_options": {"include_usage": True}}  # fmt: skip


@pytest.fixture
def slow_pool(tmp_path: Path) -> Iterator[Stack]:
    """Two throughput engines, streams of ~4 s (STREAM_TOKENS at 4x)."""
    s = start_stack(tmp_path, latency=0, throughput=2, speedup=4, outlier=FAST_OUTLIER)
    yield s
    s.stop()


def test_the_streams_of_a_crashed_engine_are_continued(slow_pool: Stack) -> None:
    victim = slow_pool.throughput[0]
    results = asyncio.run(_streams(slow_pool, 8, victim.kill, STREAM))
    assert any(b == victim.url for b, _, _ in results)
    for _, _, text in results:
        check_whole(text, STREAM_TOKENS)
    gw = slow_pool.gateway.url
    continued = metric(gw, "tiergate_continuations", "tiergate_continuations_total",
                       outcome="continued")  # fmt: skip
    assert continued == sum(b == victim.url for b, _, _ in results)


def test_the_streams_of_a_frozen_engine_are_continued_within_seconds(slow_pool: Stack) -> None:
    """The engine stops producing while /health and /metrics still answer: within the idle
    timeout its streams go on from another engine, the client none the wiser."""
    frozen = slow_pool.throughput[0]

    def freeze() -> None:
        httpx.post(frozen.url + "/sim/faults", json={"hang": True}).raise_for_status()

    results = asyncio.run(_streams(slow_pool, 8, freeze, STREAM))
    assert any(b == frozen.url for b, _, _ in results)
    for _, gap, text in results:
        check_whole(text, STREAM_TOKENS)
        assert gap < 3.5  # the idle timeout (2.5 s), a sweep, and the continuation's first token


def test_a_chat_stream_is_continued_as_one_assistant_message(slow_pool: Stack) -> None:
    """With continuous usage, as a benchmark client asks for it: every chunk's usage counts the
    tokens the client has had so far, across the break."""
    victim = slow_pool.throughput[0]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me"}],
            "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    results = asyncio.run(_streams(slow_pool, 6, victim.kill, body, "/v1/chat/completions"))
    assert any(b == victim.url for b, _, _ in results)
    for _, _, text in results:
        check_whole(text, STREAM_TOKENS, chat=True)
        sent, counted = 0, []
        for e in _events(text):
            sent += sum(bool(c["delta"].get("content")) for c in e["choices"])
            counted.append((sent, e["usage"]["completion_tokens"]))
        assert all(a == b for a, b in counted), [x for x in counted if x[0] != x[1]][:3]


def test_a_client_can_opt_out_of_continuation(slow_pool: Stack) -> None:
    victim = slow_pool.throughput[0]

    async def run() -> list[tuple[str, str]]:
        started = 0
        async with httpx.AsyncClient(timeout=60) as c:

            async def stream() -> tuple[str, str]:
                nonlocal started
                async with c.stream("POST", slow_pool.gateway.url + "/v1/completions", json=STREAM,
                                    headers={"x-tiergate-continue": "off"}) as r:  # fmt: skip
                    text = ""
                    async for chunk in r.aiter_text():
                        if chunk and not text:
                            started += 1
                        text += chunk
                    return r.headers["x-tiergate-backend"], text

            tasks = [asyncio.create_task(stream()) for _ in range(4)]
            await wait_until_async(lambda: started == 4 or any(t.done() for t in tasks),
                                   "all 4 streams under way")  # fmt: skip
            victim.kill()
            return list(await asyncio.gather(*tasks))

    for backend, text in asyncio.run(run()):
        events = _events(text)
        assert ("error" in events[-1]) is (backend == victim.url)


def test_a_slow_first_token_is_hedged_and_the_slow_engine_avoided(stack: Stack) -> None:
    """One engine takes 5 s more to start each answer: a stream waits for it at most the hedge
    deadline (1 s at least), and the engine is soon out of rotation."""
    slow = stack.throughput[0]
    httpx.post(slow.url + "/sim/faults", json={"slow_first_token_s": 5.0}).raise_for_status()

    async def run() -> list[tuple[str, float]]:
        async with httpx.AsyncClient(timeout=30) as c:

            async def one() -> tuple[str, float]:
                t0 = time.monotonic()
                body = BODY | {"stream": True}
                async with c.stream("POST", stack.gateway.url + "/v1/completions", json=body,
                                    headers={"x-tiergate-tier": "throughput"}) as r:  # fmt: skip
                    ttft = None
                    async for _ in r.aiter_bytes():
                        ttft = ttft or time.monotonic() - t0
                assert ttft is not None
                return r.headers["x-tiergate-backend"], ttft

            out = []
            for _ in range(6):  # waves of 4 at once
                out += await asyncio.gather(*(one() for _ in range(4)))
            return out

    results = asyncio.run(run())
    assert max(t for _, t in results) < 2.5  # never the 5 s: the hedge answered after ~1 s
    assert {b for b, _ in results} == {stack.throughput[1].url}
    gw = stack.gateway.url
    won = metric(gw, "tiergate_hedges", "tiergate_hedges_total", outcome="won")
    assert won >= 1
    # It gets few: its wait is learned at once, and three hedged in a row eject it.
    assert won <= 6
