"""The gateway over real sockets, in front of real simulator processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.stack import (
    MODEL,
    Stack,
    gc_collected,
    start_stack,
    wait_until,
    wait_until_async,
)

# Bounds on time and placement: run after the parallel tests, alone (scripts/test).
pytestmark = pytest.mark.serial

BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 16,
                        "ignore_eos": True}  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # golden-range: these tests check its fixed limits (the learned policy: test_learned.py).
    s = start_stack(tmp_path_factory.mktemp("stack"), speedup=10, policy={"name": "golden-range"},
                    retry={"retry_statuses": [429, 500, 502, 503, 504]},
                    outlier={"base_ejection_s": 1.0})  # fmt: skip
    yield s
    s.stop()


def families(url: str) -> dict[str, list[Any]]:
    text = httpx.get(url + "/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def total(fams: dict[str, list[Any]], family: str, name: str | None = None,
          **labels: str) -> float:  # fmt: skip
    return sum(
        s.value for s in fams.get(family, [])
        if s.name == (name or family) and all(s.labels.get(k) == v for k, v in labels.items())
    )  # fmt: skip


# -- the API ----------------------------------------------------------------------------------


def test_openai_client_non_streaming_and_streaming(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="EMPTY")
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hello", max_tokens=8, extra_body={"ignore_eos": True})  # fmt: skip
    out = raw.parse()
    assert out.usage is not None
    assert out.usage.completion_tokens == 8
    assert raw.headers["x-tiergate-tier"] == "latency"
    assert raw.headers["x-tiergate-backend"] == stack.latency[0].url
    assert raw.headers["x-tiergate-attempts"] == "1"
    chunks = list(client.completions.create(
        model=MODEL, prompt="hello", max_tokens=20, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))  # fmt: skip
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 20
    assert "".join(c.choices[0].text for c in chunks if c.choices).count(" ") == 20
    chat = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True,
        extra_body={"ignore_eos": True}))  # fmt: skip
    assert chat[-1].choices[0].finish_reason == "length"
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL  # its `/` sent as %2F
    assert httpx.get(f"{stack.gateway.url}/v1/models/{MODEL}").json()["id"] == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("nope")


def test_single_request_goes_to_the_latency_tier(stack: Stack) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", json=BODY)
    assert r.status_code == 200
    assert r.headers["x-tiergate-tier"] == "latency"
    assert r.headers["x-request-id"]


@pytest.mark.parametrize("tier", ["latency", "throughput"])
def test_pinned_tier(stack: Stack, tier: str) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", json=BODY,
                   headers={"x-tiergate-tier": tier})  # fmt: skip
    assert r.headers["x-tiergate-tier"] == tier


def test_vllm_extras_and_request_id_pass_through(stack: Stack) -> None:
    # priority 0: a nonzero one is refused by an engine without priority scheduling (as vLLM
    # does); min_tokens shows in the usage that the extras arrived.
    body = BODY | {"min_tokens": 30, "max_tokens": 40, "ignore_eos": False, "priority": 0}
    r = httpx.post(stack.gateway.url + "/v1/completions", json=body,
                   headers={"x-request-id": "abc-123"})  # fmt: skip
    assert r.headers["x-request-id"] == "abc-123"
    assert r.json()["usage"]["completion_tokens"] >= 30


@pytest.mark.parametrize(
    ("content", "status", "param"),
    [
        (json.dumps(BODY | {"model": "gpt-9"}), 404, "model"),
        ("{bad json", 400, None),
        ("[1, 2]", 400, None),
        (json.dumps({"model": MODEL}), 400, "prompt"),
        (json.dumps(BODY | {"max_tokens": "many"}), 400, "max_tokens"),
        (json.dumps(BODY | {"stream_options": {"include_usage": True}}), 400, None),
        (json.dumps(BODY | {"prompt": "x " * 700_000}), 413, None),
    ],
)
def test_client_mistakes_get_openai_errors(
    stack: Stack, content: str, status: int, param: str | None
) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", content=content,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["code"], err["param"]) == (status, param)
    assert "Traceback" not in err["message"]


def test_bad_tier_header(stack: Stack) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", json=BODY,
                   headers={"x-tiergate-tier": "fastest"})  # fmt: skip
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "x-tiergate-tier"


def test_engine_client_errors_pass_through_without_retry(stack: Stack) -> None:
    r = httpx.post(stack.gateway.url + "/v1/completions", json=BODY | {"max_tokens": 9000})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    assert r.headers["x-tiergate-attempts"] == "1"


def test_retry_moves_a_failed_attempt_to_the_next_backend(stack: Stack) -> None:
    bad = stack.throughput[0]
    httpx.post(bad.url + "/sim/faults", json={"error_rate": 1.0})
    try:
        # Until the failing engine is ejected: routing tries it first about half the time,
        # and three failures in a row (or 30% of 10) take it out. (Prompts of their own: a
        # prompt sent again goes back where it was answered, prefix affinity's doing.)
        for i in range(60):
            r = httpx.post(stack.gateway.url + "/v1/completions",
                           json=BODY | {"prompt": f"{BODY['prompt']} {i}"},
                           headers={"x-tiergate-tier": "throughput"})  # fmt: skip
            assert r.status_code == 200
            assert r.headers["x-tiergate-backend"] == stack.throughput[1].url
            if _backend_view(stack, bad.url)["ejected_reason"] is not None:
                break
    finally:
        httpx.post(bad.url + "/sim/faults", json={"error_rate": 0.0})
    fams = families(stack.gateway.url)
    assert total(fams, "tiergate_retries", "tiergate_retries_total", backend=bad.url) >= 1
    view = _backend_view(stack, bad.url)
    assert view["ejected_reason"] == "requests_http_500"

    # Healthy again, it comes back through probation: one request at a time, three successes
    # (the stack's outlier settings), after its ejection has run out.
    tries = itertools.count()

    def back() -> bool:
        httpx.post(stack.gateway.url + "/v1/completions",
                   json=BODY | {"prompt": f"{BODY['prompt']} again {next(tries)}"},
                   headers={"x-tiergate-tier": "throughput"})  # fmt: skip
        view = _backend_view(stack, bad.url)
        return view["ejected_reason"] is None and not view["probation"]

    assert wait_until(back, "the backend back in full rotation", timeout_s=10)


def _backend_view(stack: Stack, url: str) -> dict[str, Any]:
    state = httpx.get(stack.gateway.url + "/state").json()
    (view,) = [b for b in state["backends"] if b["url"] == url]
    return cast(dict[str, Any], view)


def test_side_endpoints_and_metrics(stack: Stack) -> None:
    gw = stack.gateway.url
    assert httpx.get(gw + "/health").json() == {"status": "ok"}
    ready = httpx.get(gw + "/ready")
    assert ready.status_code == 200
    assert ready.json()["models"] == {MODEL: True}
    state = httpx.get(gw + "/state").json()
    assert state["policy"] == "golden-range"
    assert {b["url"] for b in state["backends"]} == {s.url for s in stack.sims}
    # With usage in the stream the gateway counts exact tokens (without it, chunks).
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    httpx.post(gw + "/v1/completions", json=BODY | usage)
    # An earlier test may have had a backend ejected: wait until all three are back.
    fams = wait_until(lambda: (f := families(gw)) and total(f, "tiergate_backend_up") == 3 and f,
                      "all three backends up", timeout_s=10)  # fmt: skip
    assert total(fams, "tiergate_requests", "tiergate_requests_total", tier="latency") >= 1
    assert total(fams, "tiergate_routing_decisions", "tiergate_routing_decisions_total",
                 policy="golden-range", reason="golden_range") >= 1  # fmt: skip
    assert total(fams, "tiergate_ttft_seconds", "tiergate_ttft_seconds_count",
                 tier="latency") >= 1  # fmt: skip
    assert total(fams, "tiergate_tpot_seconds", "tiergate_tpot_seconds_count") >= 1
    assert total(fams, "tiergate_output_tokens", "tiergate_output_tokens_total") >= 16
    assert total(fams, "tiergate_backend_up") == 3
    # `tier` is the role on every metric, whatever the tiers are named in the config.
    up = [x for x in fams["tiergate_backend_up"] if x.name == "tiergate_backend_up"]
    assert Counter(x.labels["tier"] for x in up) == {"throughput": 2, "latency": 1}
    assert "tiergate_backend_queue_depth" in fams
    assert "tiergate_backend_kv_usage" in fams


def test_requests_leave_no_reference_cycles(stack: Stack) -> None:
    """What a request allocates is freed by reference counting when it ends: the cycle
    collector finds less than one object a request (a request's own cycle, once, left about
    ten each, proxied or answered by the gateway itself, and every collection paid for them)."""
    gw = stack.gateway.url
    requests = 200
    before = gc_collected(gw)
    with httpx.Client(base_url=gw, timeout=30) as client:
        for i in range(requests):
            # streamed and whole answers, as the relay writes each its own way
            body = BODY | {"max_tokens": 2, "stream": i % 2 == 0}
            assert client.post("/v1/completions", json=body).status_code == 200
            # and what the gateway answers itself (probes, client mistakes)
            assert client.get("/health").status_code == 200
            assert client.post("/v1/completions", json={"model": MODEL}).status_code == 400
    # Ten objects a request left for the collector would pass its first generation's
    # threshold (700) a few times over: it ran, and found them.
    assert gc_collected(gw) - before < requests


def test_an_engine_error_event_mid_stream_is_relayed_and_counted(stack: Stack) -> None:
    gw = stack.gateway.url
    before = total(families(gw), "tiergate_midstream_errors", "tiergate_midstream_errors_total")
    r = httpx.post(gw + "/v1/completions", json=BODY | {"stream": True},
                   headers={"x-sim-fault": "error-mid"})  # fmt: skip
    assert r.status_code == 200
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "error" in json.loads(events[-2])
    after = total(families(gw), "tiergate_midstream_errors", "tiergate_midstream_errors_total")
    assert after == before + 1


def test_client_disconnect_cancels_the_upstream_request(stack: Stack) -> None:
    sim = stack.latency[0]

    def aborts() -> float:
        return total(families(sim.url), "vllm:request_success", "vllm:request_success_total",
                     finished_reason="abort")  # fmt: skip

    before = aborts()
    # A prompt of its own, so that the policy (not affinity) places it: on the idle latency tier.
    with httpx.stream("POST", stack.gateway.url + "/v1/completions",
                      json=BODY | {"prompt": "a stream cut short", "max_tokens": 3000,
                                   "stream": True}) as r:  # fmt: skip
        next(r.iter_lines())
    assert wait_until(lambda: aborts() > before, "the engine's abort counted", timeout_s=5)


# -- routing under load -----------------------------------------------------------------------


def test_forty_streams_cap_the_latency_tier_and_spread_the_rest(stack: Stack) -> None:
    """40 concurrent streams: the latency instance never holds more than 16 (the golden range),
    the other 24 split evenly over the throughput pool."""
    gw = stack.gateway.url
    lat = stack.latency[0].url
    peak = 0.0

    def seen_idle() -> bool:
        # The gateway's own view of the latency instance: a stream cancelled just before (the
        # test above) may still have been running in the engine when the last scrape came, and
        # that reads as a client beside the gateway until the next one.
        return total(families(gw), "tiergate_backend_queue_depth", backend=lat) == 0

    assert wait_until(seen_idle, "the gateway sees the latency instance idle", timeout_s=10)

    async def run() -> list[httpx.Response]:
        nonlocal peak
        body = BODY | {"max_tokens": 256, "stream": True}
        async with httpx.AsyncClient(timeout=60) as c:
            tasks = [asyncio.create_task(c.post(gw + "/v1/completions", json=body))
                     for _ in range(40)]  # fmt: skip
            while not all(t.done() for t in tasks):
                fams = {f.name: f.samples for f in text_string_to_metric_families(
                    (await c.get(lat + "/metrics")).text)}  # fmt: skip
                load = total(fams, "vllm:num_requests_running") + total(
                    fams, "vllm:num_requests_waiting")  # fmt: skip
                peak = max(peak, load)
                await asyncio.sleep(0.02)
            return [t.result() for t in tasks]

    responses = asyncio.run(run())
    assert all(r.status_code == 200 for r in responses)
    assert all(r.text.endswith("data: [DONE]\n\n") for r in responses)
    by_backend = Counter(r.headers["x-tiergate-backend"] for r in responses)
    assert by_backend[lat] == 16, (by_backend, peak)
    assert peak <= 16
    a, b = (by_backend[s.url] for s in stack.throughput)
    assert a + b == 24
    assert abs(a - b) <= 2


# -- failures ---------------------------------------------------------------------------------


def _sse_ok(text: str) -> bool:
    return text.endswith("data: [DONE]\n\n") and '"error"' not in text


def test_killing_a_throughput_instance_loses_no_request_that_had_not_streamed(
    tmp_path: Path,
) -> None:
    s = start_stack(tmp_path, latency=0, throughput=2, speedup=2)
    try:
        gw = s.gateway.url
        victim = s.throughput[0]

        async def run() -> tuple[list[httpx.Response], list[tuple[bool, str]]]:
            async with httpx.AsyncClient(timeout=60) as c:
                plain = [asyncio.create_task(c.post(gw + "/v1/completions",
                         json=BODY | {"max_tokens": 200})) for _ in range(30)]  # fmt: skip

                async def stream() -> tuple[bool, str]:
                    started = False
                    text = ""
                    body = BODY | {"max_tokens": 200, "stream": True}
                    async with c.stream("POST", gw + "/v1/completions", json=body) as r:
                        async for chunk in r.aiter_text():
                            started = True
                            text += chunk
                    return started, text

                streams = [asyncio.create_task(stream()) for _ in range(10)]
                await asyncio.sleep(0.4)
                victim.kill()
                return await asyncio.gather(*plain), await asyncio.gather(*streams)

        plain, streams = asyncio.run(run())
        # Not one non-streamed request is lost: none had sent a byte to its client.
        assert [r.status_code for r in plain] == [200] * 30
        assert all(r.json()["usage"]["completion_tokens"] == 200 for r in plain)
        # A stream cut after its first byte ends with an error event and [DONE]; others finish.
        for started, text in streams:
            assert started
            assert text.endswith("data: [DONE]\n\n")
        # New requests avoid the dead instance.
        for _ in range(5):
            r = httpx.post(gw + "/v1/completions", json=BODY)
            assert r.status_code == 200
            assert r.headers["x-tiergate-backend"] == s.throughput[1].url
    finally:
        s.stop()


def test_a_hung_backend_is_bypassed_within_seconds(tmp_path: Path) -> None:
    s = start_stack(tmp_path, latency=0, throughput=2, speedup=10,
                    monitor={"stall_after_s": 1.0})  # fmt: skip
    try:
        gw = s.gateway.url
        hung = s.throughput[0]
        httpx.post(hung.url + "/sim/faults", json={"hang": True})

        async def run() -> list[tuple[int, float, str]]:
            async with httpx.AsyncClient(timeout=30) as c:

                async def one() -> tuple[int, float, str]:
                    t0 = time.perf_counter()
                    r = await c.post(gw + "/v1/completions", json=BODY)
                    return r.status_code, time.perf_counter() - t0, r.headers.get(
                        "x-tiergate-backend", "")  # fmt: skip

                return await asyncio.gather(*(one() for _ in range(10)))

        results = asyncio.run(run())
        assert [code for code, _, _ in results] == [200] * 10
        assert max(t for _, t, _ in results) < 5.0
        assert {b for _, _, b in results} == {s.throughput[1].url}
        state = httpx.get(gw + "/state").json()
        (row,) = [b for b in state["backends"] if b["url"] == hung.url]
        assert row["healthy"] is False
        assert row["ejected_reason"] == "stalled"
    finally:
        s.stop()


def test_saturation_queues_then_answers_429(tmp_path: Path) -> None:
    s = start_stack(
        tmp_path, latency=1, throughput=1, speedup=1, throughput_args=("--max-num-seqs", "2"),
        policy={"name": "golden-range", "latency_max_concurrency": 1, "latency_hard_cap": 1,
                "hysteresis": 0, "max_waiting": 0, "queue_deadline_s": 0.3},
    )  # fmt: skip
    try:
        gw, engine = s.gateway.url, s.throughput[0].url

        async def run() -> None:
            async with httpx.AsyncClient(timeout=30) as c:

                async def view(url: str) -> dict[str, Any]:  # the gateway's view of `url`
                    (row,) = [b for b in (await c.get(gw + "/state")).json()["backends"]
                              if b["url"] == url]  # fmt: skip
                    return dict(row)

                async def latency_full() -> bool:
                    return bool((await view(s.latency[0].url))["effective"] >= 1)

                async def engine_queued() -> bool:
                    row = await view(engine)
                    return not row["stale"] and row["waiting"] > 0

                body = BODY | {"max_tokens": 400}
                # One request fills the latency tier (hard cap 1); six sent straight to the
                # throughput engine (max-num-seqs 2) leave a queue there, once scraped.
                busy = [asyncio.create_task(c.post(gw + "/v1/completions", json=body))]
                await wait_until_async(latency_full, "the latency tier at its hard cap")
                busy += [asyncio.create_task(c.post(engine + "/v1/completions", json=body))
                         for _ in range(6)]  # fmt: skip
                await wait_until_async(engine_queued, "the throughput engine's queue scraped")
                t0 = time.perf_counter()
                r = await c.post(gw + "/v1/completions", json=BODY)
                waited = time.perf_counter() - t0
                for t in busy:
                    t.cancel()
                await asyncio.gather(*busy, return_exceptions=True)
                assert r.status_code == 429, r.text
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "RateLimitError"
                assert waited >= 0.3

        asyncio.run(run())
    finally:
        s.stop()


# -- shared state -----------------------------------------------------------------------------


def test_two_replicas_share_in_flight_load_through_redis(tmp_path: Path, redis_server: str) -> None:
    # Routing by in-flight load alone (the learned policy may prefer the busier engine when it
    # predicts it faster): what is checked is that B sees the load A put there.
    s = start_stack(tmp_path, latency=0, throughput=2, speedup=1, gateways=2,
                    env={"TIERGATE_REDIS_URL": redis_server},
                    policy={"name": "least-loaded"})  # fmt: skip
    try:
        a, b = (g.url for g in s.gateways)

        def inflight(gw: str) -> dict[str, int]:
            return {x["url"]: x["inflight"] for x in httpx.get(gw + "/state").json()["backends"]}

        async def run() -> None:
            async with httpx.AsyncClient(timeout=60) as c:
                body = BODY | {"max_tokens": 256}
                tasks = [asyncio.create_task(c.post(a + "/v1/completions", json=body))
                         for _ in range(6)]  # fmt: skip
                seen = await asyncio.to_thread(
                    wait_until, lambda: sum(inflight(b).values()) == 6, "6 in flight", 3.0)
                assert seen, inflight(b)
                assert inflight(b) == inflight(a)
                # B routes by the load A put there: three more land on the less loaded backend.
                loads = inflight(b)
                lighter = min(loads, key=lambda u: loads[u])
                r = await c.post(b + "/v1/completions", json=BODY)
                if loads[s.throughput[0].url] != loads[s.throughput[1].url]:
                    assert r.headers["x-tiergate-backend"] == lighter
                await asyncio.gather(*tasks)
            drained = await asyncio.to_thread(
                wait_until, lambda: sum(inflight(b).values()) == 0, "none in flight", 3.0)
            assert drained

        asyncio.run(run())
        assert httpx.get(b + "/state").json()["state_store"] == {"kind": "redis", "healthy": True}
    finally:
        s.stop()
