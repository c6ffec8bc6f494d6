"""The gateway's HTTP/1.1 client for requests to the engines: pooled keep-alive connections,
one write per request, the response parsed by httptools (the C parser uvicorn uses).

Hand-written rather than aiohttp's ClientSession (still used for the monitor's scrapes and
probes): a proxied request went through aiohttp's general machinery (URL parsing, cookie
handling, tracing hooks, a request object, a task to write the body, a timer rescheduled on
every read), which was the largest single share of the gateway's CPU per request under load
(~30% under `wrk -c64` by py-spy). The engines are known, speak plain HTTP/1.1, and are sent one
kind of request, so the client does only that. Its errors are aiohttp's exception types, so that
callers handle both clients' failures alike:
- `aiohttp.ClientConnectionError`: connect refused or timed out, connection lost or closed;
- `aiohttp.ClientPayloadError`: a malformed response, or response headers past
  `MAX_HEADER_BYTES`;
- `aiohttp.ServerTimeoutError` (a `TimeoutError`): nothing read for `read_timeout_s`.

A body ends where its Content-Length or its last chunk says, or, with neither (HTTP/1.0, or
`Connection: close` and no length), where the engine closes the connection (RFC 9112 section 6.3).
Interim answers (1xx) are skipped. An event stream's lines reach the reader in one form (see
gateway.core.sse).

A request that fails on a reused idle connection before any byte of the answer (the engine closed
it as it was being reused) is sent once more on a new connection: nothing reached the engine's
application then.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urlsplit

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.core.sse import EventLines

__all__ = ["MAX_HEADER_BYTES", "Http1Pool", "Http1Response"]

# An engine's response headers, all of them, at most (names and values): aiohttp's client allows
# 8190 bytes a field; an engine's answer carries a few hundred bytes of them.
MAX_HEADER_BYTES = 64 * 1024

_HIGH_WATER = 1 << 16  # buffered body bytes past which reading from the engine pauses
_CLOSED = "Connection closed"


class Http1Response:
    """An engine's answer: status and headers, then the body read with `read`/`readany`
    (also reachable as `.content`, as with aiohttp). `release` when done (the connection goes
    back to the pool if the body was read whole), `close` to drop it (a pending read fails)."""

    __slots__ = (
        "_buf", "_buffered", "_conn", "_deadline", "_done", "_error", "_lines", "_sink",
        "_slow", "_timer", "_waiter", "headers", "status",
    )  # fmt: skip

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self.status = 0
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self._buf: list[bytes] = []
        # The bytes in `_buf`, kept as chunks come and go (summing the chunks on every arrival
        # cost more the further a reader fell behind).
        self._buffered = 0
        self._done = False  # the whole body is in
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._lines: EventLines | None = None  # an event stream's rewriter
        # The read timeout: the current wait's deadline (loop time), and the one timer that
        # enforces it (None: not armed).
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        # `pump`'s receiver of the body's pieces, called as they arrive (None: they are
        # buffered for `readany`), and whether it asked for a pause (its client is slower).
        self._sink: Callable[[bytes], bool] | None = None
        self._slow = False

    @property
    def content(self) -> Http1Response:
        return self

    async def readany(self) -> bytes:
        """What has arrived since the last read, waiting for something if nothing has; b"" at
        the body's end."""
        lines = self._lines
        while not self._buf:
            if self._error is not None:
                raise self._error
            if self._done:
                return lines.flush() if lines is not None else b""
            await self._wait()
        buf = self._buf
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self._buffered = 0
        self._conn.drained()
        if lines is not None and not (data := self._canonical(lines, data)):
            return await self.readany()  # all of it held back (a piece of a line): read on
        return data

    def _canonical(self, lines: EventLines, data: bytes) -> bytes:
        """`data` of an event stream in the one form the gateway reads (gateway.core.sse); the
        rewriter dropped once the engine shows it writes that form."""
        data = lines.feed(data)
        if lines.plain:  # nothing more to rewrite
            self._lines = None
        return data

    async def read(self) -> bytes:
        """The whole body."""
        # Taken out as it comes, each time reading resumed: a body past the high-water mark
        # paused the connection, and a reader that waits for the end would wait for ever (until
        # its read timeout) if nothing resumed it; nor may it go back to the pool paused.
        parts: list[bytes] = []
        while not self._done:
            if self._error is not None:
                raise self._error
            if self._buf:
                parts.append(self._take())
            await self._wait()
        if self._buf:
            parts.append(self._take())
        elif self._error is not None and not parts:
            raise self._error
        return b"".join(parts)

    async def pump(
        self, sink: Callable[[bytes], bool], drain: Callable[[], Awaitable[None]]
    ) -> None:
        """The rest of the body to `sink`, each read's pieces as `readany` would return them,
        from the connection's own callback as they arrive: the reader is not woken per read (a
        future, a task step and the relay's loop per token otherwise; 0.98x the instructions
        of a 64-token stream, docs/results/peers-pump). `sink` returns True when what it writes
        to is slower than the engine: pieces are buffered then (the engine's reading paused
        past the high-water mark) while `drain` is awaited. Returns at the body's end; raises
        what `readany` raises (the read timeout: nothing for `read_timeout_s`), and what
        `sink` raised."""
        try:
            while True:
                while self._buf:  # arrived while no sink took it (before, or while slow)
                    data = self._take()
                    if self._lines is not None:
                        data = self._canonical(self._lines, data)
                    if data and sink(data):
                        await drain()
                if self._error is not None:
                    raise self._error
                if self._done:
                    if self._lines is not None and (rest := self._lines.flush()) and sink(rest):
                        await drain()
                    return
                self._sink, self._slow = sink, False
                await self._wait()
                self._sink = None
                if self._slow:
                    await drain()
        finally:
            self._sink = None

    def _deliver(self, sink: Callable[[bytes], bool], data: bytes) -> None:
        """A piece of the body to `pump`'s `sink` (from the connection's `on_body`); the read
        timeout runs from it."""
        conn = self._conn
        self._deadline = conn.loop.time() + conn.pool.read_timeout_s
        if self._lines is not None and not (data := self._canonical(self._lines, data)):
            return
        try:
            slow = sink(data)
        except Exception as e:  # raised by pump, in the reader's task
            self._sink = None
            self._fail(e)
            return
        if slow:
            self._sink, self._slow = None, True
            self._wake()

    def _take(self) -> bytes:
        """What has arrived, taken out, and the connection read again if it waited for that
        (`readany` does the same inline: it runs once per streamed chunk)."""
        buf = self._buf
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self._buffered = 0
        self._conn.drained()
        return data

    def release(self) -> None:
        if self._conn.resp is self:  # not once the connection serves another request
            self._conn.finish(self._done and self._error is None)

    def close(self) -> None:
        if self._conn.resp is self:
            self._conn.finish(False)

    async def _wait(self) -> None:
        loop = self._conn.loop
        waiter = self._waiter = loop.create_future()
        # A stream waits once per chunk: a timer armed and cancelled per wait cost more than
        # the rest of the wait (~1.1 us on uvloop). One timer per response instead, armed when
        # none is, re-armed by itself while the wait it finds has not reached its deadline.
        self._deadline = deadline = loop.time() + self._conn.pool.read_timeout_s
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        try:
            await waiter
        finally:
            self._waiter = None
        if not self._buf and self._error is not None:
            raise self._error

    def _expire(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nothing waits: the next wait arms it again
        loop = self._conn.loop
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._expire)
        else:
            _time_out(waiter)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- fed by the connection ---------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


def _until_close(resp: Http1Response) -> bool:
    """Whether `resp`, its headers in, has a body that ends where the connection does (neither
    a length nor chunks). Asked only when a connection closes, not on every answer."""
    headers = resp.headers
    return (resp.status >= 200 and headers is not _NO_HEADERS
            and "content-length" not in headers and resp.status not in (204, 304)
            and "chunked" not in headers.get("transfer-encoding", "").lower())  # fmt: skip


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(aiohttp.ServerTimeoutError("Timeout on reading data from socket"))


class _Conn(asyncio.Protocol):
    """One connection to an origin, serving one request at a time."""

    def __init__(self, pool: Http1Pool, origin: _Origin) -> None:
        self.pool, self.origin = pool, origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Http1Response | None = None
        self.headers_in: asyncio.Future[None] | None = None
        self.raw_headers: list[tuple[str, str]] = []
        self.header_bytes = 0
        self.keep_alive = False
        self.complete = False
        self.received = False  # any byte of the current answer arrived
        self.paused = False
        self.lost = False
        self.idle_since = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.header_bytes > MAX_HEADER_BYTES:
                error = f"response headers larger than {MAX_HEADER_BYTES} bytes"
            else:
                error = f"malformed response: {e}"
            self._lose(aiohttp.ClientPayloadError(error))
            self.drop()
            return
        resp = self.resp
        if resp is not None and resp._sink is not None and resp._buf:
            resp._deliver(resp._sink, resp._take())

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        resp = self.resp
        if resp is not None and not self.complete and exc is None and _until_close(resp):
            # A body delimited by the connection's close: whole now.
            self.complete = resp._done = True
            resp._wake()
        elif not self.complete:
            self._lose(aiohttp.ServerDisconnectedError())
        # The parser holds this protocol's callbacks: a cycle that reference counting cannot
        # free. Nothing feeds it once the connection is gone, so it goes with it, and a
        # connection its engine closes after every answer is freed as soon as nothing uses it
        # (left to the cycle collector, about ten objects a request: docs/results/gc-cycles).
        del self.parser
        self.transport = None

    # -- httptools callbacks -------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADER_BYTES:
            raise ValueError("response headers too large")  # the parser stops: see data_received
        self.raw_headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        resp = self.resp
        if resp is None:  # an answer to nothing: the connection cannot be trusted
            self.drop()
            return
        resp.status = self.parser.get_status_code()
        if resp.status < 200:  # an interim answer (100 Continue): the real one follows
            self.raw_headers, self.header_bytes = [], 0
            return
        headers = resp.headers = CIMultiDictProxy(CIMultiDict(self.raw_headers))
        self.keep_alive = self.parser.should_keep_alive()
        if headers.get("content-type", "").startswith("text/event-stream"):
            resp._lines = EventLines()
        if self.headers_in is not None and not self.headers_in.done():
            self.headers_in.set_result(None)

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        if resp is None:
            return
        resp._buf.append(body)
        resp._buffered += len(body)
        if resp._sink is not None:
            return  # delivered once the read is parsed (data_received): one write per read
        resp._wake()
        if not self.paused and resp._buffered > _HIGH_WATER and self.transport:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        resp = self.resp
        if resp is None or resp.status < 200:
            return
        self.complete = True
        resp._done = True
        resp._wake()

    # -- the request ---------------------------------------------------------------------------
    async def send(self, request: bytes) -> Http1Response:
        assert self.transport is not None
        resp = self.resp = Http1Response(self)
        self.raw_headers, self.keep_alive, self.complete, self.received = [], False, False, False
        self.header_bytes = 0
        self.headers_in = self.loop.create_future()
        self.transport.write(request)
        timer = self.loop.call_later(self.pool.read_timeout_s, _time_out, self.headers_in)
        try:
            await self.headers_in
        finally:
            timer.cancel()
            self.headers_in = None
        return resp

    def drained(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def finish(self, reusable: bool) -> None:
        """The response is done with: back to the pool when it was read whole on a
        connection that stays open, closed otherwise."""
        resp, self.resp = self.resp, None
        if resp is None:
            return
        resp._disarm()
        if reusable and self.keep_alive and self.complete and not self.lost:
            self.idle_since = self.pool.clock()
            self.origin.idle.append(self)
        else:
            resp._fail(aiohttp.ClientConnectionError(_CLOSED))
            self.drop()

    def drop(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def _lose(self, error: BaseException) -> None:
        if self.headers_in is not None and not self.headers_in.done():
            self.headers_in.set_exception(error)
        if self.resp is not None:
            self.resp._fail(error)


class _Origin:
    """scheme://host:port, parsed once, and its idle connections (the last used first)."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rpartition("@")[2].encode("latin-1")
        self.idle: collections.deque[_Conn] = collections.deque()


class Http1Pool:
    """Keep-alive connections to each engine, no limit on their number (as the aiohttp
    connector it replaces, `limit=0`): the gateway's own admission control bounds them."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.keepalive_s, self.clock = keepalive_s, clock
        self._origins: dict[str, _Origin] = {}

    async def post(
        self, base: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Http1Response:
        """POST `body` to `base` + `path`; the response once its headers are in."""
        origin = self._origins.get(base)
        if origin is None:
            origin = self._origins[base] = _Origin(base)
        head = [b"POST ", origin.prefix.encode("latin-1"), path.encode("latin-1"),
                b" HTTP/1.1\r\nhost: ", origin.host_header,
                b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n"]  # fmt: skip
        for k, v in headers.items():
            head += [k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n"]
        head += [b"\r\n", body]
        request = b"".join(head)
        conn = self._idle(origin)
        if conn is not None:
            try:
                return await conn.send(request)
            except aiohttp.ServerDisconnectedError:
                conn.drop()
                if conn.received:
                    raise
                # Closed by the engine as it was reused: once more, on a new connection.
            except BaseException:
                conn.drop()
                raise
        conn = await self._connect(origin)
        try:
            return await conn.send(request)
        except BaseException:
            conn.drop()
            raise

    def _idle(self, origin: _Origin) -> _Conn | None:
        idle, oldest = origin.idle, self.clock() - self.keepalive_s
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.idle_since > oldest:
                return conn
            conn.drop()
        return None

    async def _connect(self, origin: _Origin) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Conn(self, origin), origin.host, origin.port, ssl=origin.ssl
                )
        except TimeoutError:
            raise aiohttp.ClientConnectionError(
                f"connecting to {origin.host}:{origin.port} timed out"
            ) from None
        except OSError as e:
            raise aiohttp.ClientConnectionError(
                f"cannot connect to {origin.host}:{origin.port}: {e}"
            ) from e
        return conn

    async def aclose(self) -> None:
        """Close every idle connection (those in use close when their request ends)."""
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().drop()
