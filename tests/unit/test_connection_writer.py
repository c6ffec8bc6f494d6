"""Writes straight to a request's connection (gateway.serve.server's `ConnectionWriter`): the
bytes uvicorn's `send` would write, in fewer writes; its flow control; a client gone."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    RequestResponseCycle,
)

from gateway.serve.server import ConnectionWriter


class Transport:
    """What the cycle writes, in order."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str) -> Any:
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def cycle(
    method: str = "POST", keep_alive: bool = True,
    default_headers: list[tuple[bytes, bytes]] | None = None, access_log: bool = False,
    on_response: Any = lambda: None,
) -> tuple[RequestResponseCycle, Transport]:  # fmt: skip
    transport = Transport()
    scope: Any = {"type": "http", "method": method, "path": "/v1/completions", "headers": []}
    c = RequestResponseCycle(
        scope=scope, transport=transport, flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"), access_logger=logging.getLogger("test"),
        access_log=access_log, default_headers=default_headers or [],
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
        on_response=on_response,
    )  # fmt: skip
    return c, transport


START = {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"text/event-stream")]}  # fmt: skip
CHUNKS = [b"data: {}\n\n", b"x", b"data: [DONE]\n\n" * 40]


async def test_the_bytes_are_those_send_writes() -> None:
    by_send, sent = cycle()
    await by_send.send(START)
    for chunk in CHUNKS:
        await by_send.send({"type": "http.response.body", "body": chunk, "more_body": True})
    await by_send.send({"type": "http.response.body", "body": b""})

    direct, written = cycle()
    await direct.send(START)
    writer = ConnectionWriter(direct)
    assert [writer.chunk(chunk) for chunk in CHUNKS] == [False] * len(CHUNKS)
    await direct.send({"type": "http.response.body", "body": b""})

    assert written.written == sent.written
    assert direct.response_complete


async def test_a_client_reading_slower_is_waited_for() -> None:
    c, _ = cycle()
    await c.send(START)
    writer = ConnectionWriter(c)
    c.flow.pause_writing()  # the transport's buffer is past its high-water mark
    assert writer.chunk(b"a") is True
    drained = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0)
    assert not drained.done()
    c.flow.resume_writing()
    await asyncio.wait_for(drained, 5)
    assert writer.chunk(b"b") is False
    await writer.drain()  # nothing to wait for


async def test_nothing_is_written_to_a_client_gone() -> None:
    c, transport = cycle()
    await c.send(START)
    before = list(transport.written)
    c.disconnected = True
    assert ConnectionWriter(c).chunk(b"a") is False
    assert transport.written == before


@pytest.mark.parametrize("when", ["before the answer started", "after it ended"])
async def test_a_chunk_outside_a_chunked_answer_in_progress_is_a_bug(when: str) -> None:
    c, _ = cycle()
    if when == "after it ended":
        await c.send(START)
        await c.send({"type": "http.response.body", "body": b""})
    with pytest.raises(RuntimeError):
        ConnectionWriter(c).chunk(b"a")


WHOLE = [
    {"type": "http.response.start", "status": 200,
     "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]},
    {"type": "http.response.body", "body": b"{}"},
]  # fmt: skip


async def test_a_whole_answer_held_goes_out_in_one_write() -> None:
    by_send, sent = cycle()
    for message in WHOLE:
        await by_send.send(message)
    assert len(sent.written) == 2  # uvicorn: the start, then the body

    held, written = cycle()
    with ConnectionWriter(held).held():
        for message in WHOLE:
            await held.send(message)
    assert written.written == [b"".join(sent.written)]
    assert held.response_complete
    assert held.transport is written


async def test_a_start_held_with_no_body_after_it_is_still_written() -> None:
    c, written = cycle()

    async def fails_after_its_start() -> None:
        with ConnectionWriter(c).held():
            await c.send(WHOLE[0])
            raise LookupError("the app failed between its start and its body")

    with pytest.raises(LookupError, match="between its start and its body"):
        await fails_after_its_start()
    assert len(written.written) == 1
    assert written.written[0].startswith(b"HTTP/1.1 200")
    assert c.transport is written


SERVER = [(b"server", b"uvicorn"), (b"date", b"Fri, 04 Dec 2026 17:30:00 GMT")]


@pytest.mark.parametrize(
    ("headers", "keep_alive"),
    [
        ([(b"content-type", b"application/json"), (b"x-request-id", b"abc")], True),
        ([(b"Content-Type", b"application/json"), (b"Retry-After", b"1")], True),  # any case
        ([(b"content-type", b"application/json"), (b"connection", b"Close")], True),
        ([(b"content-type", b"application/json")], False),  # the client asked to close
        ([], True),
        ([(b"x-note", b"a\tb")], True),  # a tab is allowed in a value
    ],
)
async def test_a_whole_answer_is_the_bytes_and_the_state_send_leaves(
    headers: list[tuple[bytes, bytes]], keep_alive: bool
) -> None:
    body = b'{"id": 1}'
    responses: list[str] = []
    by_send, sent = cycle(keep_alive=keep_alive, default_headers=SERVER,
                          on_response=lambda: responses.append("send"))  # fmt: skip
    await by_send.send({"type": "http.response.start", "status": 429,
                        "headers": [*headers, (b"content-length", b"%d" % len(body))]})  # fmt: skip
    await by_send.send({"type": "http.response.body", "body": body})

    direct, written = cycle(keep_alive=keep_alive, default_headers=SERVER,
                            on_response=lambda: responses.append("whole"))  # fmt: skip
    assert ConnectionWriter(direct).whole(429, headers, body) is True
    assert written.written == [b"".join(sent.written)]  # one write
    for state in ("response_started", "response_complete", "keep_alive", "chunked_encoding",
                  "expected_content_length", "waiting_for_100_continue"):  # fmt: skip
        assert getattr(direct, state) == getattr(by_send, state), state
    assert direct.message_event.is_set()
    assert written.closed == sent.closed
    assert responses == ["send", "whole"]


@pytest.mark.parametrize(
    ("why", "headers", "kwargs"),
    [
        ("a HEAD request: no body", [], {"method": "HEAD"}),
        ("an access log to write", [], {"access_log": True}),
        ("the caller's own length", [(b"content-length", b"2")], {}),
        ("the caller's own framing", [(b"transfer-encoding", b"chunked")], {}),
        ("a header name send refuses", [(b"bad name", b"x")], {}),
        ("a header value send refuses", [(b"x-note", b"a\r\nb")], {}),
    ],
)
async def test_a_whole_answer_send_must_write_is_left_to_it(
    why: str, headers: list[tuple[bytes, bytes]], kwargs: dict[str, Any]
) -> None:
    c, written = cycle(**kwargs)
    assert ConnectionWriter(c).whole(200, headers, b"{}") is False, why
    assert written.written == []
    assert not c.response_started


@pytest.mark.parametrize("byte", range(256))
async def test_every_byte_in_a_header_is_refused_exactly_where_send_refuses_it(byte: int) -> None:
    """The writer's test of names and values (bytes deleted by a table) against `send`'s
    regular expressions, for every byte alone and amid allowed ones."""
    for name, value in [
        (bytes([byte]), b"x"),
        (b"x-" + bytes([byte]) + b"-y", b"x"),
        (b"x-note", bytes([byte])),
        (b"x-note", b"a" + bytes([byte]) + b"b"),
    ]:
        refused = bool(HEADER_RE.search(name) or HEADER_VALUE_RE.search(value))
        c, written = cycle()
        assert ConnectionWriter(c).whole(200, [(name, value)], b"{}") is not refused, (name, value)
        assert bool(written.written) is not refused


async def test_a_whole_answer_waits_for_send_where_the_client_reads_slower() -> None:
    c, written = cycle()
    c.flow.pause_writing()
    assert ConnectionWriter(c).whole(200, [], b"{}") is False  # `send` waits, then writes
    assert written.written == []


async def test_a_whole_answer_to_a_client_gone_writes_nothing() -> None:
    c, written = cycle()
    c.disconnected = True
    assert ConnectionWriter(c).whole(200, [], b"{}") is True  # as `send` does: nothing
    assert written.written == []
    begun, _ = cycle()
    await begun.send(WHOLE[0])
    begun.disconnected = True
    assert ConnectionWriter(begun).whole(200, [], b"{}") is False


STREAM_HEADERS = [(b"content-type", b"text/event-stream"), (b"x-request-id", b"abc")]


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("tail", [b"", b"data: [DONE]\n\n"])
async def test_a_stream_begun_and_ended_is_the_bytes_and_the_state_send_leaves(
    keep_alive: bool, tail: bytes
) -> None:
    responses: list[str] = []
    by_send, sent = cycle(keep_alive=keep_alive, default_headers=SERVER,
                          on_response=lambda: responses.append("send"))  # fmt: skip
    await by_send.send({"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS})
    for chunk in CHUNKS:
        await by_send.send({"type": "http.response.body", "body": chunk, "more_body": True})
    if tail:
        await by_send.send({"type": "http.response.body", "body": tail, "more_body": True})
    await by_send.send({"type": "http.response.body", "body": b""})

    direct, written = cycle(keep_alive=keep_alive, default_headers=SERVER,
                            on_response=lambda: responses.append("direct"))  # fmt: skip
    writer = ConnectionWriter(direct)
    assert writer.begin(200, STREAM_HEADERS) is True
    assert written.written == []  # held for the first chunk
    for chunk in CHUNKS:
        assert writer.chunk(chunk) is False
    writer.end(tail)

    assert b"".join(written.written) == b"".join(sent.written)
    assert len(written.written) == len(CHUNKS) + 1  # the start with the first chunk, the tail
    for state in ("response_started", "response_complete", "keep_alive", "chunked_encoding",
                  "expected_content_length", "waiting_for_100_continue"):  # fmt: skip
        assert getattr(direct, state) == getattr(by_send, state), state
    assert direct.message_event.is_set()
    assert written.closed == sent.closed == (not keep_alive)
    assert responses == ["send", "direct"]


async def test_a_start_held_is_written_when_flushed_or_with_the_end() -> None:
    c, written = cycle()
    writer = ConnectionWriter(c)
    assert writer.begin(200, STREAM_HEADERS) is True
    writer.flush()
    assert len(written.written) == 1
    assert written.written[0].startswith(b"HTTP/1.1 200")
    assert written.written[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    writer.flush()  # nothing held: nothing written
    assert writer.chunk(b"a") is False
    assert written.written[1:] == [b"1\r\na\r\n"]

    empty, alone = cycle()
    writer = ConnectionWriter(empty)
    assert writer.begin(200, STREAM_HEADERS) is True
    writer.end(b"")  # no chunk at all: the start and the end in one write
    assert len(alone.written) == 1
    assert alone.written[0].endswith(b"\r\n\r\n0\r\n\r\n")
    assert empty.response_complete


@pytest.mark.parametrize(
    ("why", "status", "headers", "kwargs"),
    [
        ("a HEAD request: no body", 200, [], {"method": "HEAD"}),
        ("an access log to write", 200, [], {"access_log": True}),
        ("a status without a body", 204, [], {}),
        ("the caller's own length", 200, [(b"content-length", b"2")], {}),
        ("the caller's own framing", 200, [(b"transfer-encoding", b"chunked")], {}),
        ("a header name send refuses", 200, [(b"bad name", b"x")], {}),
    ],
)
async def test_a_stream_start_send_must_write_is_left_to_it(
    why: str, status: int, headers: list[tuple[bytes, bytes]], kwargs: dict[str, Any]
) -> None:
    c, written = cycle(**kwargs)
    assert ConnectionWriter(c).begin(status, headers) is False, why
    assert written.written == []
    assert not c.response_started


async def test_a_stream_to_a_client_gone_writes_nothing() -> None:
    c, written = cycle()
    writer = ConnectionWriter(c)
    assert writer.begin(200, STREAM_HEADERS) is True
    c.disconnected = True
    assert writer.chunk(b"a") is False
    writer.flush()
    writer.end(b"data: [DONE]\n\n")
    assert written.written == []


async def test_an_end_outside_a_chunked_answer_in_progress_is_a_bug() -> None:
    c, _ = cycle()
    with pytest.raises(RuntimeError):
        ConnectionWriter(c).end(b"")
