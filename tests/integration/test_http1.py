"""The gateway's upstream HTTP/1.1 client against scripted servers on loopback sockets: pooling,
streaming, the stale-connection retry, timeouts and broken answers, each as aiohttp's errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest

from gateway.core.http1 import Http1Pool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


class Server:
    """Counts connections and requests; `handle` answers each connection."""

    def __init__(self, handle: Handler) -> None:
        self.handle, self.connections = handle, 0
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@asynccontextmanager
async def serving(handle: Handler) -> AsyncIterator[Server]:
    server = Server(handle)
    srv = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    server.port = srv.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        srv.close()


def pool(**kw: float) -> Http1Pool:
    args = {"connect_timeout_s": 1.0, "read_timeout_s": 1.0, "keepalive_s": 4.0, **kw}
    return Http1Pool(**args)  # type: ignore[arg-type]


async def test_keeps_one_connection_alive_for_sequential_requests() -> None:
    seen: list[bytes] = []

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await read_request(r))
            w.write(OK)

    async with serving(answer) as srv:
        p = pool()
        for _ in range(3):
            resp = await p.post(srv.url, "/v1/completions", b'{"a":1}', {"x-request-id": "r1"})
            assert (resp.status, resp.headers["Content-Type"]) == (200, "application/json")
            assert await resp.read() == b"{}"
            resp.release()
        await p.aclose()
    assert srv.connections == 1
    head, _, body = seen[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{srv.port}".encode() in head
    assert b"x-request-id: r1" in head
    assert body == b'{"a":1}'


async def test_streams_chunked_bodies_piece_by_piece() -> None:
    go = asyncio.Event()

    async def stream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await w.drain()
        await go.wait()
        w.write(b"6\r\n world\r\n0\r\n\r\n")
        await w.drain()
        await asyncio.sleep(1)

    async with serving(stream) as srv:
        p = pool()
        resp = await p.post(srv.url, "/x", b"", {})
        assert await resp.content.readany() == b"hello"
        go.set()
        assert await resp.content.readany() == b" world"
        assert await resp.content.readany() == b""
        resp.release()
        await p.aclose()


async def test_a_reader_that_falls_behind_pauses_the_engine_then_gets_every_byte() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB, sent as fast as the socket takes it

    async def flood(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await w.drain()
        await asyncio.sleep(1)

    async with serving(flood) as srv:
        p = pool(read_timeout_s=5.0)
        resp = await p.post(srv.url, "/x", b"", {})
        conn = resp._conn
        for _ in range(500):  # until the buffered body passes the high-water mark
            if conn.paused:
                break
            await asyncio.sleep(0.01)
        assert conn.paused  # the rest waits in the kernel's buffers, not in this process
        assert 0 < resp._buffered < len(body)
        assert await resp.read() == body
        assert resp._buffered == 0
        resp.release()
        await p.aclose()


async def test_a_connection_paused_by_the_end_of_a_body_serves_the_next_answer() -> None:
    """Whole bodies past the high-water mark, one after another on one kept-alive connection,
    each read once the connection has paused: the last of a body may pause it, and it must go
    back to the pool reading again (it went back paused, and the next answer was never read)."""
    body = bytes(range(256)) * 1200  # 300 KiB

    async def answers(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
            await w.drain()

    async with serving(answers) as srv:
        p = pool(read_timeout_s=3.0)
        for _ in range(4):
            resp = await p.post(srv.url, "/x", b"{}", {})
            conn = resp._conn
            for _ in range(300):  # until the engine's bytes pass the high-water mark
                if conn.paused:
                    break
                await asyncio.sleep(0.01)
            assert conn.paused
            assert await resp.read() == body
            assert not conn.paused
            resp.release()
        await p.aclose()
    assert srv.connections == 1


async def test_an_idle_connection_closed_by_the_engine_is_replaced_transparently() -> None:
    async def one_answer_then_close(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK)
        await w.drain()
        await asyncio.sleep(0.05)  # closed while the client holds it idle

    async with serving(one_answer_then_close) as srv:
        p = pool()
        for _ in range(3):
            resp = await p.post(srv.url, "/x", b"{}", {})
            assert await resp.read() == b"{}"
            resp.release()
            await asyncio.sleep(0.1)
        await p.aclose()
    assert srv.connections == 3


async def test_a_body_left_unread_does_not_go_back_to_the_pool() -> None:
    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234")
            await w.drain()

    async with serving(answer) as srv:
        p = pool()
        for _ in range(2):
            resp = await p.post(srv.url, "/x", b"{}", {})
            resp.release()
        await p.aclose()
    assert srv.connections == 2


async def test_idle_connections_expire_after_the_keepalive_time() -> None:
    now = [0.0]

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(OK)

    async with serving(answer) as srv:
        p = Http1Pool(connect_timeout_s=1, read_timeout_s=1, keepalive_s=4, clock=lambda: now[0])
        for t in (0.0, 3.0, 8.0):
            now[0] = t
            resp = await p.post(srv.url, "/x", b"{}", {})
            await resp.read()
            resp.release()
        await p.aclose()
    assert srv.connections == 2  # reused at 3 s, expired by 8 s


async def test_a_silent_engine_times_out_as_a_timeout_error() -> None:
    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        await asyncio.sleep(5)

    async with serving(silent) as srv:
        p = pool(read_timeout_s=0.2)
        with pytest.raises(TimeoutError):
            await p.post(srv.url, "/x", b"{}", {})
        await p.aclose()


async def test_a_stream_that_goes_silent_times_out_mid_body() -> None:
    async def stalls(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await asyncio.sleep(5)

    async with serving(stalls) as srv:
        p = pool(read_timeout_s=0.2)
        resp = await p.post(srv.url, "/x", b"{}", {})
        assert await resp.readany() == b"a"
        with pytest.raises(aiohttp.ServerTimeoutError):
            await resp.readany()
        resp.close()
        await p.aclose()


async def test_the_read_timeout_is_per_read_however_long_the_stream_lasts() -> None:
    """Chunks closer together than the read timeout never time out, over a stream several
    timeouts long; the silence after them does, about one timeout after the last chunk."""
    sent = asyncio.Event()

    async def drips(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(8):
            await asyncio.sleep(0.1)
            w.write(b"1\r\na\r\n")
        sent.set()
        await asyncio.sleep(5)

    async with serving(drips) as srv:
        p = pool(read_timeout_s=0.3)
        resp = await p.post(srv.url, "/x", b"{}", {})
        got = b""
        while len(got) < 8:
            got += await resp.readany()
        assert got == b"a" * 8  # 0.8 s of stream, no read waited 0.3 s
        await sent.wait()
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(aiohttp.ServerTimeoutError):
            await resp.readany()
        assert 0.2 <= loop.time() - began < 2.0
        resp.close()
        await p.aclose()


async def test_close_fails_a_pending_read_at_once() -> None:
    async def stalls(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(5)

    async with serving(stalls) as srv:
        p = pool(read_timeout_s=5)
        resp = await p.post(srv.url, "/x", b"{}", {})
        reading = asyncio.ensure_future(resp.readany())
        await asyncio.sleep(0.05)
        resp.close()
        with pytest.raises(aiohttp.ClientConnectionError):
            await asyncio.wait_for(reading, 1)
        await p.aclose()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", aiohttp.ClientPayloadError),
        (b"", aiohttp.ServerDisconnectedError),  # closed without a word
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01", aiohttp.ClientConnectionError),
    ],
    ids=["garbage", "closed", "cut-short"],
)
async def test_broken_answers_are_aiohttp_errors(answer: bytes, error: type[Exception]) -> None:
    async def broken(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(answer)
        await w.drain()

    async with serving(broken) as srv:
        p = pool()

        async def whole() -> bytes:
            resp = await p.post(srv.url, "/x", b"{}", {})
            return await resp.read()

        with pytest.raises(error):
            await whole()
        await p.aclose()


async def test_connection_refused_is_a_connection_error() -> None:
    async with serving(read_request) as srv:  # type: ignore[arg-type]
        url = srv.url
    p = pool()
    with pytest.raises(aiohttp.ClientConnectionError, match="cannot connect"):
        await p.post(url, "/x", b"{}", {})
    await p.aclose()


async def test_a_backend_url_with_a_path_prefixes_the_request_path() -> None:
    seen: list[bytes] = []

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        seen.append(await read_request(r))
        w.write(OK)

    async with serving(answer) as srv:
        p = pool()
        resp = await p.post(srv.url + "/engine-a/", "/v1/completions", b"{}", {})
        await resp.read()
        resp.release()
        await p.aclose()
    assert seen[0].startswith(b"POST /engine-a/v1/completions HTTP/1.1\r\n")


async def test_a_finished_response_cannot_close_the_next_request_on_its_connection() -> None:
    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(OK)

    async with serving(answer) as srv:
        p = pool()
        first = await p.post(srv.url, "/x", b"{}", {})
        await first.read()
        first.release()
        second = await p.post(srv.url, "/x", b"{}", {})  # the same connection, reused
        first.close()  # late: must not touch the second request
        assert await second.read() == b"{}"
        second.release()
        await p.aclose()
    assert srv.connections == 1


# -- pump: the body handed to a sink from the connection's own callback ---------------------------

CHUNKED = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
           b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def test_a_pumped_body_reaches_the_sink_in_order_and_its_connection_is_reused() -> None:
    steps = [asyncio.Event() for _ in range(3)]

    async def stream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(CHUNKED + chunk(b"data: 1\n\n"))
        for i, part in enumerate([b"data: 2\n\n", b"data: 3\n\ndata: 4\n\n"]):
            await steps[i].wait()
            w.write(chunk(part))
        await steps[2].wait()
        w.write(b"0\r\n\r\n")
        await read_request(r)  # the next request, on the same connection
        w.write(OK)

    got: list[bytes] = []

    def sink(data: bytes) -> bool:
        got.append(data)
        for step in steps:  # the next part once this one is in
            if not step.is_set():
                step.set()
                break
        return False

    async def never() -> None:
        raise AssertionError("a sink that never asks for a pause is never drained")

    async with serving(stream) as srv:
        p = pool()
        resp = await p.post(srv.url, "/x", b"{}", {})
        await asyncio.wait_for(resp.pump(sink, never), 5)
        assert b"".join(got) == b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n"
        assert got[0] == b"data: 1\n\n"
        resp.release()
        again = await p.post(srv.url, "/x", b"{}", {})
        assert await again.read() == b"{}"
        again.release()
        await p.aclose()
    assert srv.connections == 1


async def test_a_sink_slower_than_the_engine_is_drained_and_loses_nothing() -> None:
    parts = [b"data: %d\n\n" % i for i in range(50)]

    first_in = asyncio.Event()

    async def flood(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(CHUNKED + chunk(parts[0]))
        await first_in.wait()  # the rest while the sink drains
        for part in parts[1:]:
            w.write(chunk(part))
            await w.drain()
            await asyncio.sleep(0)
        w.write(b"0\r\n\r\n")
        await asyncio.sleep(1)

    got: list[bytes] = []
    client_reads = asyncio.Event()
    drains = 0

    def sink(data: bytes) -> bool:
        got.append(data)
        first_in.set()
        return len(got) == 1  # the client is slower after the first piece

    async def drain() -> None:
        nonlocal drains
        drains += 1
        await client_reads.wait()

    async with serving(flood) as srv:
        p = pool()
        resp = await p.post(srv.url, "/x", b"{}", {})
        pumping = asyncio.ensure_future(resp.pump(sink, drain))
        for _ in range(500):  # until pieces wait in the response while it drains
            if got and resp._buffered:
                break
            await asyncio.sleep(0.01)
        assert resp._buffered > 0
        assert len(got) == 1
        assert not pumping.done()
        client_reads.set()
        await asyncio.wait_for(pumping, 5)
        assert b"".join(got) == b"".join(parts)
        assert drains == 1
        resp.release()
        await p.aclose()


async def test_a_pumped_stream_gone_silent_times_out_one_timeout_after_its_last_piece() -> None:
    sent = asyncio.Event()

    async def drips(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(CHUNKED)
        for _ in range(8):
            await asyncio.sleep(0.1)
            w.write(chunk(b"a"))
        sent.set()
        await asyncio.sleep(5)

    got: list[bytes] = []

    async def drain() -> None:
        pass

    async with serving(drips) as srv:
        p = pool(read_timeout_s=0.3)
        resp = await p.post(srv.url, "/x", b"{}", {})
        pumping = asyncio.ensure_future(resp.pump(lambda d: got.append(d) is not None, drain))
        await sent.wait()
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(aiohttp.ServerTimeoutError):
            await pumping
        assert 0.2 <= loop.time() - began < 2.0  # not 0.3 s from the pump's start
        assert b"".join(got) == b"a" * 8
        resp.close()
        await p.aclose()


@pytest.mark.parametrize("how", ["the sink raises", "the response is closed", "the engine breaks"])
async def test_a_pump_ends_with_the_failure_that_ended_it(how: str) -> None:
    first_in = asyncio.Event()

    async def stream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(CHUNKED + chunk(b"data: 1\n\n"))
        await first_in.wait()  # the next piece a delivery of its own
        if how == "the engine breaks":
            w.write(b"zz\r\nnot a chunk\r\n")
        else:
            w.write(chunk(b"data: 2\n\n"))
        await asyncio.sleep(5)

    expected: type[BaseException] = {
        "the sink raises": LookupError, "the response is closed": aiohttp.ClientConnectionError,
        "the engine breaks": aiohttp.ClientPayloadError}[how]  # fmt: skip
    got: list[bytes] = []

    async with serving(stream) as srv:
        p = pool(read_timeout_s=5)
        resp = await p.post(srv.url, "/x", b"{}", {})

        def sink(data: bytes) -> bool:
            got.append(data)
            first_in.set()
            if how == "the sink raises" and len(got) == 2:
                raise LookupError("the sink failed")
            if how == "the response is closed":
                resp.close()
            return False

        async def drain() -> None:
            pass

        with pytest.raises(expected):
            await asyncio.wait_for(resp.pump(sink, drain), 5)
        assert got[0] == b"data: 1\n\n"
        resp.close()
        await p.aclose()


async def test_a_pumped_event_stream_reaches_the_sink_in_the_canonical_form() -> None:
    async def crlf(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(CHUNKED + chunk(b"data:1\r\n\r"))
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(chunk(b"\ndata: 2\r\n\r\n") + b"0\r\n\r\n")
        await asyncio.sleep(1)

    got: list[bytes] = []

    async def drain() -> None:
        pass

    async with serving(crlf) as srv:
        p = pool()
        resp = await p.post(srv.url, "/x", b"{}", {})
        await asyncio.wait_for(resp.pump(lambda d: got.append(d) is not None, drain), 5)
        assert b"".join(got) == b"data: 1\n\ndata: 2\n\n"
        resp.release()
        await p.aclose()
