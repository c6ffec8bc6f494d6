"""Engines that speak valid but less common HTTP/1.1 and SSE, and engines that break the rules,
behind one real gateway: a raw-socket engine per case (its own tier and model), a plain HTTP
client in front. Every valid case answers 200 with the engine's content exactly (text,
usage, [DONE]); every broken case a clean OpenAI-style 502 or 504 within its timeout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtests.harness.procs import GatewayProcess
from tests.integration.stack import gc_collected

Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]

TEXT = ["Hello", " wor", "ld", " \u00e9t\u00e9", "!"]  # the last but one: two bytes a letter
USAGE = {"prompt_tokens": 3, "completion_tokens": len(TEXT), "total_tokens": 3 + len(TEXT)}
ANSWER = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "text": "".join(TEXT), "logprobs": None,
                       "finish_reason": "length"}], "usage": USAGE}  # fmt: skip
FIRST_BYTE_TIMEOUT_S = 1.5
# A long answer, as with many tokens or their logprobs: far past the 64 KiB at which the
# gateway stops reading ahead of its client.
LARGE = {**ANSWER, "choices": [{**ANSWER["choices"][0], "text": "tokens " * 100_000}]}


def _events(sep: bytes = b"\n", colon: bytes = b"data: ") -> list[bytes]:
    """The stream as vLLM sends it, each line ended by `sep`, `colon` before each payload."""
    out = []
    for i, piece in enumerate(TEXT):
        last = i == len(TEXT) - 1
        chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                 "choices": [{"index": 0, "text": piece, "logprobs": None,
                              "finish_reason": "length" if last else None}]}  # fmt: skip
        out.append(colon + json.dumps(chunk).encode() + sep + sep)
    usage = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
             "choices": [], "usage": USAGE}  # fmt: skip
    out.append(colon + json.dumps(usage).encode() + sep + sep)
    out.append(colon + b"[DONE]" + sep + sep)
    return out


def _head(status: bytes, *headers: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    return version + b" " + status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


SSE = b"content-type: text/event-stream"
JSON = b"content-type: application/json"


async def _chunked(w: asyncio.StreamWriter, parts: list[bytes], ext: bytes = b"") -> None:
    w.write(_head(b"200 OK", SSE, b"transfer-encoding: chunked"))
    for p in parts:
        w.write(b"%x%s\r\n%s\r\n" % (len(p), ext, p))
        await w.drain()
    w.write(b"0\r\nx-trailer: yes\r\n\r\n")


def _json_until_close(version: bytes) -> Writer:
    async def write(w: asyncio.StreamWriter) -> None:
        w.write(_head(b"200 OK", JSON, b"connection: close", version=version))
        body = json.dumps(ANSWER).encode()
        w.write(body[:40])
        await w.drain()
        w.write(body[40:])
        w.close()

    return write


async def _json_http10_with_length(w: asyncio.StreamWriter) -> None:
    body = json.dumps(ANSWER).encode()
    w.write(_head(b"200 OK", JSON, b"content-length: %d" % len(body), version=b"HTTP/1.0") + body)
    w.close()


async def _json_large(w: asyncio.StreamWriter) -> None:
    body = json.dumps(LARGE).encode()
    w.write(_head(b"200 OK", JSON, b"content-length: %d" % len(body)) + body)


async def _interim_then_json(w: asyncio.StreamWriter) -> None:
    body = json.dumps(ANSWER).encode()
    w.write(_head(b"100 Continue") + _head(b"103 Early Hints", b"link: </x>; rel=preload"))
    await w.drain()
    w.write(_head(b"200 OK", JSON, b"content-length: %d" % len(body)) + body)


def _stream(sep: bytes, colon: bytes = b"data: ", byte_by_byte: bool = False) -> Writer:
    async def write(w: asyncio.StreamWriter) -> None:
        data = b"".join(_events(sep, colon))
        parts = [data[i : i + 1] for i in range(len(data))] if byte_by_byte else _events(sep, colon)
        await _chunked(w, parts)

    return write


async def _stream_with_comments(w: asyncio.StreamWriter) -> None:
    events = _events()
    await _chunked(w, [b": ping\n\n", events[0], b": ping\n\n", *events[1:]])


async def _stream_chunk_extensions(w: asyncio.StreamWriter) -> None:
    await _chunked(w, _events(), ext=b";name=value")


async def _stream_until_close(w: asyncio.StreamWriter) -> None:
    w.write(_head(b"200 OK", SSE, b"connection: close"))
    for e in _events():
        w.write(e)
        await w.drain()
    w.close()


async def _garbage(w: asyncio.StreamWriter) -> None:
    w.write(b"HELLO THERE\r\n\r\n")


async def _huge_headers(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\n")
    for i in range(200):
        w.write(b"x-filler-%d: %s\r\n" % (i, b"a" * 1000))
    w.write(JSON + b"\r\ncontent-length: 2\r\n\r\n{}")


async def _early_close(w: asyncio.StreamWriter) -> None:
    w.close()


async def _short_body(w: asyncio.StreamWriter) -> None:
    w.write(_head(b"200 OK", JSON, b"content-length: 500") + b'{"id": "cmpl-1"')
    await w.drain()
    w.close()


async def _silent(w: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


THINKING_S = 2.0  # a reasoning model's pause between its reasoning and its answer


async def _reasoning_chat(w: asyncio.StreamWriter) -> None:
    """A reasoning model's chat stream as vLLM sends it: the role, three reasoning tokens
    (`delta.reasoning`), a pause, two tokens of answer (`delta.content`), usage over all five."""

    def event(delta: dict[str, object], **extra: object) -> bytes:
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    w.write(_head(b"200 OK", SSE, b"transfer-encoding: chunked"))
    thinking = [event({"role": "assistant", "content": ""})]
    thinking += [event({"reasoning": t}) for t in ("Let", " me", " see")]
    for e in thinking:
        w.write(b"%x\r\n%s\r\n" % (len(e), e))
    await w.drain()
    await asyncio.sleep(THINKING_S)
    answer = [event({"content": t}) for t in ("Four", ".")]
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    answer += [event({}, usage=usage).replace(b'"choices":[{"index":0,"delta":{},'
                                              b'"finish_reason":null}]', b'"choices":[]'),
               b"data: [DONE]\n\n"]  # fmt: skip
    for e in answer:
        w.write(b"%x\r\n%s\r\n" % (len(e), e))
    w.write(b"0\r\n\r\n")


@dataclass(frozen=True)
class Case:
    name: str
    write: Writer
    stream: bool
    valid: bool
    answer: dict[str, object] | None = None  # a non-streamed answer other than ANSWER


CASES = [
    Case("json-http11-until-close", _json_until_close(b"HTTP/1.1"), False, True),
    Case("json-http10-until-close", _json_until_close(b"HTTP/1.0"), False, True),
    Case("json-http10-length", _json_http10_with_length, False, True),
    Case("json-after-1xx", _interim_then_json, False, True),
    Case("json-large", _json_large, False, True, LARGE),
    Case("sse-lf", _stream(b"\n"), True, True),
    Case("sse-crlf", _stream(b"\r\n"), True, True),
    Case("sse-cr", _stream(b"\r"), True, True),
    Case("sse-no-space", _stream(b"\n", b"data:"), True, True),
    Case("sse-crlf-byte-by-byte", _stream(b"\r\n", b"data:", byte_by_byte=True), True, True),
    Case("sse-comments", _stream_with_comments, True, True),
    Case("sse-chunk-extensions-trailers", _stream_chunk_extensions, True, True),
    Case("sse-until-close", _stream_until_close, True, True),
    Case("garbage", _garbage, False, False),
    Case("huge-headers", _huge_headers, False, False),
    Case("early-close", _early_close, False, False),
    Case("short-body", _short_body, False, False),
    Case("silent", _silent, False, False),
    Case("silent-stream", _silent, True, False),
]
REASONING = Case("reasoning-chat", _reasoning_chat, True, True)


class Engines:
    """One raw-socket engine per case, on an event loop of its own: GET /health and /metrics
    answer plainly; a POST gets the case's answer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ports: dict[str, int] = {}
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self, cases: list[Case]) -> None:
        self._thread.start()
        for case in cases:
            server = asyncio.run_coroutine_threadsafe(self._serve(case), self.loop).result(10)
            self._servers.append(server)
            self.ports[case.name] = server.sockets[0].getsockname()[1]

    async def _serve(self, case: Case) -> asyncio.Server:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await r.readuntil(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    await r.readexactly(length)
                    if head.startswith(b"GET "):
                        body = b"" if b"/metrics" in head.split(b"\r\n")[0] else b"OK"
                        w.write(_head(b"200 OK", b"content-length: %d" % len(body)) + body)
                        await w.drain()
                        continue
                    await case.write(w)
                    await w.drain()
                    if w.is_closing():
                        return
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                w.close()

        return await asyncio.start_server(handle, "127.0.0.1", 0)

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("conformance")
    engines = Engines()
    engines.start([*CASES, REASONING])
    tiers = [{"name": c.name, "role": "throughput", "backends": [{
        "url": f"http://127.0.0.1:{engines.ports[c.name]}", "models": [c.name]}]}
        for c in [*CASES, REASONING]]  # fmt: skip
    config = {"tiers": tiers, "retry": {"first_byte_timeout_s": FIRST_BYTE_TIMEOUT_S},
              "request_timeout_s": FIRST_BYTE_TIMEOUT_S * 2, "hedge": {"enabled": False},
              "monitor": {"scrape_interval_s": 5, "probe_interval_s": 0.5}}  # fmt: skip
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    gw = GatewayProcess(config=path, log=tmp / "gateway.log")
    try:
        gw.start()
        yield gw.url
    finally:
        gw.stop()
        engines.stop()


def _sse_text(body: str) -> tuple[str, list[dict[str, object]], bool]:
    """(the text, the usage objects, whether it ended with [DONE]) of a relayed stream."""
    text, usages, done = "", [], False
    for event in body.split("\n\n"):
        if not event.startswith("data: "):
            continue
        payload = event[6:]
        if payload == "[DONE]":
            done = True
            continue
        chunk = json.loads(payload)
        assert "error" not in chunk, chunk
        text += "".join(c["text"] for c in chunk["choices"])
        if chunk.get("usage"):
            usages.append(chunk["usage"])
    return text, usages, done


def _samples(gateway: str, model: str) -> dict[str, float]:
    """The gateway's own samples of a model's streams (/metrics), summed by name."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(gateway + "/metrics").text):
        for s in family.samples:
            if s.labels.get("model") == model:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _counted(gateway: str, model: str) -> tuple[float, float]:
    """The gateway's own count of a model's streamed tokens, and of its streams timed to their
    first token."""
    got = _samples(gateway, model)
    return got.get("tiergate_output_tokens_total", 0.0), got.get("tiergate_ttft_seconds_count", 0.0)


@pytest.mark.parametrize("case", [c for c in CASES if c.valid], ids=lambda c: c.name)
def test_a_valid_answer_reaches_the_client_exactly(gateway: str, case: Case) -> None:
    body: dict[str, object] = {"model": case.name, "prompt": "hi", "max_tokens": 5,
                               "stream": case.stream}  # fmt: skip
    if case.stream:
        body["stream_options"] = {"include_usage": True}
    before = _counted(gateway, case.name)
    r = httpx.post(gateway + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    if not case.stream:
        assert r.json() == (case.answer or ANSWER)
        return
    text, usages, done = _sse_text(r.text)
    assert (text, usages, done) == ("".join(TEXT), [USAGE], True)
    # The gateway read the stream as the client did, however the engine's bytes were cut into
    # reads: its text timed from the first token, its tokens counted from its usage.
    # (Recorded once the request is over, which may be just after the client has its end.)
    deadline = time.monotonic() + 10
    while (counted := _counted(gateway, case.name)) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (counted[0] - before[0], counted[1] - before[1]) == (len(TEXT), 1)
    # Re-emitted in the form every client reads: LF line ends, `data: ` with its space.
    assert "\r" not in r.text
    assert r.text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize("case", [c for c in CASES if not c.valid], ids=lambda c: c.name)
def test_a_broken_answer_is_a_clean_gateway_error(gateway: str, case: Case) -> None:
    body = {"model": case.name, "prompt": "hi", "max_tokens": 5, "stream": case.stream}
    began = time.monotonic()
    r = httpx.post(gateway + "/v1/completions", json=body, timeout=30)
    took = time.monotonic() - began
    assert r.status_code in (502, 504), r.text
    error = r.json()["error"]
    assert error["code"] == r.status_code
    assert error["message"]
    assert "Traceback" not in error["message"]
    # Within the request's own timeout (retries included), never a hang.
    assert took < FIRST_BYTE_TIMEOUT_S * 2 + 5, took
    if case.name == "huge-headers":
        assert "response headers larger than" in error["message"]


@pytest.mark.parametrize("name", ["sse-lf", "sse-crlf-byte-by-byte"])
def test_usage_a_client_did_not_ask_for_is_taken_out(gateway: str, name: str) -> None:
    """The gateway asks every engine for usage; a client that did not ask gets none, however
    the engine writes its JSON (here with spaces: `"choices": []`) or cuts its events."""
    body = {"model": name, "prompt": "hi", "max_tokens": 5, "stream": True}
    r = httpx.post(gateway + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert _sse_text(r.text) == ("".join(TEXT), [], True)


def test_a_reasoning_models_stream_is_timed_from_its_first_token(gateway: str) -> None:
    """Reasoning tokens are the stream's first: TTFT ends at the first of them, not at the
    answer's first (after the pause), and TPOT spans all five tokens usage counts."""
    name = REASONING.name
    body = {"model": name, "messages": [{"role": "user", "content": "2+2?"}], "stream": True}
    r = httpx.post(gateway + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert "data: [DONE]" in r.text
    assert '"usage"' not in r.text  # (not asked for)
    deadline = time.monotonic() + 10
    while not (got := _samples(gateway, name)).get("tiergate_tpot_seconds_count") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.02)
    assert got["tiergate_output_tokens_total"] == 5
    assert got["tiergate_ttft_seconds_count"] == 1
    assert got["tiergate_ttft_seconds_sum"] < THINKING_S * 0.75
    # Over the 4 intervals after the first token, the pause among them.
    assert got["tiergate_tpot_seconds_sum"] > THINKING_S / 4 * 0.75


def test_the_broken_engines_left_no_connection_stuck(gateway: str) -> None:
    """After the broken cases the gateway still serves the valid ones at once."""
    with contextlib.closing(httpx.Client(timeout=10)) as c:
        r = c.post(gateway + "/v1/completions",
                   json={"model": "sse-crlf", "prompt": "hi", "max_tokens": 5, "stream": True})
    assert r.status_code == 200
    assert _sse_text(r.text)[0] == "".join(TEXT)


def test_engines_that_close_each_connection_leave_no_reference_cycles(gateway: str) -> None:
    """A connection closed by its engine after every answer is freed with it (its protocol,
    parser and transport), not left for the cycle collector: one such cycle a request, else."""
    requests = 120
    before = gc_collected(gateway)
    with contextlib.closing(httpx.Client(timeout=10)) as c:
        for i in range(requests):
            stream = i % 2 == 0
            model = "sse-until-close" if stream else "json-http10-until-close"
            r = c.post(gateway + "/v1/completions",
                       json={"model": model, "prompt": "hi", "max_tokens": 5, "stream": stream})
            assert r.status_code == 200
    # (A cycle of a few objects a request would pass the collector's first threshold, 700,
    # and be found.)
    assert gc_collected(gateway) - before < requests
