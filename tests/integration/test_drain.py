"""Graceful drain, over real sockets: a real gateway process in front of a simulator, streams in
flight, then SIGTERM (or SIGINT). /ready turns 503 at once while new requests are still served
for the pre-stop delay; then new connections are refused, and the streams either finish whole
(a long drain timeout) or end with an SSE error event and [DONE] (a short one, or a second
signal). The process exits 0 with no traceback and no ERROR line."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.harness.procs import GatewayProcess
from tests.integration.stack import MODEL, Stack, add_gateway, start_stack

# Bounds on time and placement: run after the parallel tests, alone (scripts/test).
pytestmark = pytest.mark.serial

STREAMS = 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Real time (speedup 1): ~16 ms a token alone, more with 20 streams on one engine.
    s = start_stack(tmp_path_factory.mktemp("drain"), latency=0, throughput=1, speedup=1,
                    gateways=0)  # fmt: skip
    yield s
    s.stop()


def gateway(stack: Stack, workdir: Path, **shutdown: float) -> GatewayProcess:
    return add_gateway(stack, workdir, f"gateway-{len(stack.gateways)}", shutdown=shutdown,
                       policy={"name": "least-loaded"})  # fmt: skip


def body(max_tokens: int, stream: bool = True) -> dict[str, Any]:
    # ignore_eos: the simulator writes exactly max_tokens tokens.
    doc = {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens, "ignore_eos": True}
    if stream:
        doc |= {"stream": True, "stream_options": {"include_usage": True}}
    return doc


class Streams:
    """`n` streams on connections of their own, each read to its end; `started` is set once
    every one has had its first event."""

    def __init__(self, url: str, n: int, max_tokens: int) -> None:
        self.url, self.n, self.max_tokens = url, n, max_tokens
        self.started = asyncio.Event()
        self.firsts = 0

    async def one(self) -> list[str]:
        events: list[str] = []
        limits = httpx.Limits(max_connections=1)
        async with (
            httpx.AsyncClient(timeout=120, limits=limits) as client,
            client.stream("POST", self.url + "/v1/completions", json=body(self.max_tokens)) as r,
        ):
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 1:
                    self.firsts += 1
                    if self.firsts == self.n:
                        self.started.set()
        return events

    def run(self) -> asyncio.Future[list[list[str]]]:
        return asyncio.gather(*(self.one() for _ in range(self.n)))


def words(events: list[str]) -> int:
    text = "".join(c["text"] for e in events if e.startswith("{")
                   for c in json.loads(e).get("choices", []))  # fmt: skip
    return len(text.split())


def usage(events: list[str]) -> int | None:
    for e in events:
        if e.startswith("{") and (u := json.loads(e).get("usage")):
            return int(u["completion_tokens"])
    return None


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


async def wait_exit(gw: GatewayProcess, within_s: float) -> int:
    assert gw.proc is not None
    deadline = time.monotonic() + within_s
    while (code := gw.proc.poll()) is None:
        assert time.monotonic() < deadline, "the gateway did not exit"
        await asyncio.sleep(0.05)
    return code


def clean_log(gw: GatewayProcess) -> str:
    assert gw.log is not None
    text = gw.log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert " ERROR " not in text, text[-3000:]
    return text


async def test_sigterm_lets_every_stream_finish_whole(stack: Stack, tmp_path: Path) -> None:
    pre_stop = 1.5
    gw = gateway(stack, tmp_path, pre_stop_delay_s=pre_stop, drain_timeout_s=60)
    streams = Streams(gw.url, STREAMS, max_tokens=300)
    running = streams.run()
    await asyncio.wait_for(streams.started.wait(), 30)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        # At once: not ready, and saying why.
        r = await client.get(gw.url + "/ready")
        assert r.status_code == 503
        assert r.json()["draining"] is True
        # During the pre-stop delay new connections and requests are still served.
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(timeout=10) as fresh:
            r = await fresh.post(gw.url + "/v1/completions", json=body(4, stream=False))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert time.monotonic() - signalled < pre_stop
    # Then the listener closes while the streams still run.
    while not refused(gw.port):
        assert time.monotonic() - signalled < pre_stop + 2, "still accepting after the delay"
        await asyncio.sleep(0.05)
    assert not running.done()
    results = await asyncio.wait_for(running, 60)
    for events in results:
        assert events[-1] == "[DONE]"
        assert not any('"error"' in e for e in events)
        assert usage(events) == 300
        assert words(events) == 300
    assert await wait_exit(gw, 15) == 0
    log = clean_log(gw)
    assert "draining" in log
    assert "drained" in log


async def test_streams_past_the_drain_timeout_end_with_an_error_event(
    stack: Stack, tmp_path: Path
) -> None:
    gw = gateway(stack, tmp_path, pre_stop_delay_s=0.5, drain_timeout_s=1.0)
    streams = Streams(gw.url, STREAMS, max_tokens=3000)  # a minute or more each
    running = streams.run()
    async with httpx.AsyncClient(timeout=60) as client:
        waiting = asyncio.ensure_future(
            client.post(gw.url + "/v1/completions", json=body(3000, stream=False))
        )
        await asyncio.wait_for(streams.started.wait(), 30)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        results = await asyncio.wait_for(running, 20)
        whole = await waiting
    took = time.monotonic() - signalled
    assert 1.5 <= took < 6, took
    for events in results:
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert "shutting down" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == 503  # the gateway's own unavailability, not an engine's failure
        assert 0 < words(events) < 3000
    # A request not answered yet is answered 503 in OpenAI's shape.
    assert whole.status_code == 503
    assert whole.json()["error"]["code"] == 503
    assert await wait_exit(gw, 15) == 0
    assert "drain timeout" in clean_log(gw)


async def test_a_second_signal_ends_the_drain_at_once(stack: Stack, tmp_path: Path) -> None:
    gw = gateway(stack, tmp_path, pre_stop_delay_s=30, drain_timeout_s=120)
    streams = Streams(gw.url, 4, max_tokens=3000)
    running = streams.run()
    await asyncio.wait_for(streams.started.wait(), 30)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGINT)  # Ctrl-C drains as SIGTERM does
    await asyncio.sleep(0.5)
    assert not running.done()
    gw.proc.send_signal(signal.SIGTERM)
    results = await asyncio.wait_for(running, 10)
    for events in results:
        assert events[-1] == "[DONE]"
        assert "error" in json.loads(events[-2])
    assert await wait_exit(gw, 10) == 0
    clean_log(gw)
