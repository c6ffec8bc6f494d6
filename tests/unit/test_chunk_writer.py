"""A streamed answer's chunks written straight to the connection (gateway.serve.server's
`ChunkWriter`): the bytes uvicorn's `send` would write, its flow control, a client gone."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.serve.server import ChunkWriter


class Transport:
    """What the cycle writes, in order."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str) -> Any:
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def cycle() -> tuple[RequestResponseCycle, Transport]:
    transport = Transport()
    scope: Any = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    c = RequestResponseCycle(
        scope=scope, transport=transport, flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"), access_logger=logging.getLogger("test"),
        access_log=False, default_headers=[], message_event=asyncio.Event(),
        expect_100_continue=False, keep_alive=True, on_response=lambda: None,
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
    write = ChunkWriter(direct)
    assert [write(chunk) for chunk in CHUNKS] == [False] * len(CHUNKS)
    await direct.send({"type": "http.response.body", "body": b""})

    assert written.written == sent.written
    assert direct.response_complete


async def test_a_client_reading_slower_is_waited_for() -> None:
    c, _ = cycle()
    await c.send(START)
    write = ChunkWriter(c)
    c.flow.pause_writing()  # the transport's buffer is past its high-water mark
    assert write(b"a") is True
    drained = asyncio.ensure_future(write.drain())
    await asyncio.sleep(0)
    assert not drained.done()
    c.flow.resume_writing()
    await asyncio.wait_for(drained, 5)
    assert write(b"b") is False
    await write.drain()  # nothing to wait for


async def test_nothing_is_written_to_a_client_gone() -> None:
    c, transport = cycle()
    await c.send(START)
    before = list(transport.written)
    c.disconnected = True
    assert ChunkWriter(c)(b"a") is False
    assert transport.written == before


@pytest.mark.parametrize("when", ["before the answer started", "after it ended"])
async def test_a_chunk_outside_a_chunked_answer_in_progress_is_a_bug(when: str) -> None:
    c, _ = cycle()
    if when == "after it ended":
        await c.send(START)
        await c.send({"type": "http.response.body", "body": b""})
    with pytest.raises(RuntimeError):
        ChunkWriter(c)(b"a")
