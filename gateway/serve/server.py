"""The gateway's HTTP server: uvicorn (uvloop, httptools), with what it lacks for facing clients
that misbehave and for shutting down without cutting anyone.

`GatewayProtocol`, uvicorn's httptools protocol with a few overrides:
- a deadline on the request head (from a connection's opening, or a kept-alive connection's
  next bytes, to the end of the headers) and one on the body (from the end of the headers to
  its end). uvicorn only has the keep-alive timeout, so slow or silent clients (slowloris) and
  never-ending bodies held their connections forever. A connection that sent nothing is
  closed; one that sent part of a request gets a 408. The app cannot see a connection before
  its headers are complete, so the head deadline has to live here; the body's lives beside it
  so that every proxied request pays for neither a timer nor an `asyncio.timeout`: a deadline
  is one float set per phase, and a sweep over the open connections (every 0.25 s, ~0.1 ms for
  1,000 connections) enforces them. Measured on uvloop: `call_later` + `cancel` ~1.1 us, twice
  per request; reading the loop's clock ~0.05 us. The protocol in process, a small POST on a
  kept-alive connection: 12.5 us per request stock, 13.6 us with these overrides (medians of 7
  x 20,000), against ~400 us of gateway CPU per proxied request. The keep-alive wait between
  requests is a deadline of the same sweep (uvicorn arms a timer after every answer and the
  next request cancels it).
- the request head's size (request line and headers, default 16 KB): more is 431. httptools
  buffers a header until it is whole, so the head's raw bytes are counted as they arrive.
- a connection limit: requests on connections past `max_connections` are answered 503 (uvicorn's
  own `limit_concurrency` answers plain text).
- its refusals (these, and malformed HTTP) are OpenAI error JSON; after writing one it stops
  writing (FIN), reads and discards what the client still sends for a moment, then closes:
  closing at once with unread data would reset the connection and lose the answer.

`ConnectionWriter`, one per request (in its scope): the writes the gateway makes most, past
uvicorn's `send` and with its cycle's state kept as `send` keeps it: a stream's chunks (one per
chunk the engine sends, so what it saves is saved per token), and a whole answer's start held
for its body (one write, a system call and a packet, instead of two).

`GatewayServer`, uvicorn's server with the gateway's own signal handling: on SIGTERM or SIGINT
/ready turns 503 at once (`Drain.begin`), requests are still served for
`shutdown.pre_stop_delay_s`, then the listener closes and requests in flight get
`shutdown.drain_timeout_s` to finish; those still running then end cleanly (`Drain.cut`). A
second signal skips what is left of both waits; a third stops waiting for connections. The
process exits 0 (uvicorn's own handler stops accepting at once, cuts streams after its
graceful timeout with no SSE error, and re-raises the signal: exit status -15).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import operator
import signal
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Protocol

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from gateway.config.settings import ServerConfig, Settings, ShutdownConfig
from gateway.core.errors import error_json
from gateway.pipeline.drain import Drain

__all__ = [
    "CLIENT_GONE",
    "CONNECTION_WRITER",
    "ConnectionWriter",
    "GatewayConfig",
    "GatewayProtocol",
    "GatewayServer",
    "Guard",
    "build_server",
    "raise_fd_limit",
    "run_server",
]

log = logging.getLogger(__name__)

SWEEP_S = 0.25  # how often deadlines are enforced
REPORT_S = 10.0  # refusals are logged as counts at most this often (a flood is one line)
LINGER_S = 2.0  # after a refusal, how long the client's remaining bytes are read and dropped
# uvicorn's own last resort after the drain deadline, when our cut has not ended everything.
CUT_GRACE_S = 10.0
CUT_REASON = "The gateway is shutting down and its drain timeout has passed; retry the request."
# The scope key of a request's list of callbacks for its client going away (the connection
# lost, or refused mid-request). The app registers one instead of a task that waits on
# `receive()` for `http.disconnect`: one task fewer per request, measurably cheaper.
CLIENT_GONE = "tiergate.client_gone"
# The scope key of a request's `ConnectionWriter`.
CONNECTION_WRITER = "tiergate.connection_writer"


# The bytes `send` refuses in a header's name and in its value: those its regular expressions
# (a character class each) match, found here by deleting them (`bytes.translate`, a table
# lookup a byte) rather than by a regular expression's search (~50 instructions a byte: 11,500
# of a small answer's ~614,000).
_NAME_BYTES = bytes(b for b in range(256) if HEADER_RE.fullmatch(bytes([b])))
_VALUE_BYTES = bytes(b for b in range(256) if HEADER_VALUE_RE.fullmatch(bytes([b])))


_NAME, _VALUE = operator.itemgetter(0), operator.itemgetter(1)
_HEADER = b": ".join  # a header's line, without its CRLF, from (name, value)


def _refused(data: bytes, refused: bytes) -> bool:
    """Whether `data` holds any of the bytes in `refused`."""
    return len(data.translate(None, refused)) != len(data)


class ConnectionWriter:
    """Writes to a request's connection past uvicorn's `send` (its cycle's state kept as
    `send` keeps it), for what the gateway writes most:
    - `chunk`: a chunked answer's body chunk, what `send` does with an `http.response.body`
      message that has more to come, without the message, its checks and two coroutines (the
      relay writes one per chunk the engine sends);
    - `held`: an answer's start held for its body, one write (a system call and a packet) for a
      whole small answer instead of two: while in it, this object is the cycle's transport,
      holding the first write for the next.
    - `whole`: a whole answer with its content-length, start and body, in one write and
      without `send`: its two messages, a regular expression per header name and per value
      (one over all the names and one over all the values here), two coroutines.
    - `begin` and `end`: a chunked answer's (a stream's) start and end, as `send` writes them
      without its messages and checks; the start held for the first chunk (one write for
      both) until `flush`."""

    __slots__ = ("_cycle", "_head", "_start", "_transport")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._transport: asyncio.Transport = cycle.transport
        self._head: bytes | None = None
        self._start: bytes | None = None  # a chunked answer's start, held for its first chunk

    def chunk(self, body: bytes) -> bool:
        cycle = self._cycle
        if cycle.disconnected:
            return False  # as `send` does: the app learns it through CLIENT_GONE
        if not cycle.chunked_encoding or cycle.response_complete:
            raise RuntimeError("a body chunk written outside a chunked answer in progress")
        start = self._start
        if start is None:
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        else:
            self._start = None
            cycle.transport.write(b"%b%x\r\n%b\r\n" % (start, len(body), body))
        return cycle.flow.write_paused

    def begin(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """A chunked answer's start (`headers` without framing; its transfer-encoding added
        here) with the cycle's state left as `send` leaves it after an `http.response.start`
        without a length, the bytes held for the first `chunk`, `end` or `flush`. False,
        nothing written, where `send` must do it (`_head_bytes` says when, and a status
        without a body)."""
        cycle = self._cycle
        if cycle.disconnected:
            return not cycle.response_started  # as `send` then: nothing written
        if status in (204, 304):  # no body: `send` frames neither
            return False
        start = self._head_bytes(status, [*cycle.default_headers, *headers], b"transfer-encoding")
        if start is None:
            return False
        cycle.chunked_encoding, cycle.expected_content_length = True, 0
        self._start = start
        return True

    def flush(self) -> None:
        """The start `begin` held, written now (the first chunk is not in hand)."""
        start, self._start = self._start, None
        if start is not None and not self._cycle.disconnected:
            self._cycle.transport.write(start)

    def end(self, tail: bytes) -> None:
        """The chunked answer's last chunk (`tail`, may be empty) and its end, as `send` writes
        an `http.response.body` message without more to come, with the cycle's state left as
        `send` leaves it."""
        cycle = self._cycle
        if cycle.disconnected:
            return  # as `send` does
        if not cycle.chunked_encoding or cycle.response_complete:
            raise RuntimeError("a chunked answer ended that is not in progress")
        body = b"%x\r\n%b\r\n0\r\n\r\n" % (len(tail), tail) if tail else b"0\r\n\r\n"
        start, self._start = self._start, None
        cycle.transport.write(body if start is None else start + body)
        self._completed()

    def _completed(self) -> None:
        """The cycle's state and its connection as `send` leaves them after an answer's end."""
        cycle = self._cycle
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()

    def _head_bytes(
        self, status: int, every: list[tuple[bytes, bytes]], framing: bytes
    ) -> bytes | None:
        """The status line and `every` header with `framing` (the answer's content-length or
        transfer-encoding, the last of `every` or added here) as `send` writes them, the cycle
        marked started; None where `send` must write them: the answer begun, a client not
        reading (`send` waits for it), an access log to write, a HEAD request, framing headers
        of the caller's, a header `send` would refuse (it says why)."""
        cycle = self._cycle
        if (cycle.response_started or cycle.flow.write_paused or cycle.access_log
                or cycle.scope["method"] == "HEAD"):  # fmt: skip
            return None
        # (map and join, not comprehensions and appends: no bytecode a header; a small answer's
        # eight in 0.86x the time, docs/results/instructions-header-lines)
        names = list(map(bytes.lower, map(_NAME, every)))
        values = list(map(_VALUE, every))
        given = names[:-1] if framing == b"content-length" else names
        if (b"content-length" in given or b"transfer-encoding" in given
                or _refused(b"".join(names), _NAME_BYTES)
                or _refused(b"\t".join(values), _VALUE_BYTES)):  # fmt: skip
            return None  # (a tab is allowed in a value, so joining with one hides nothing)
        # (`in` first: the gateway's own answers have no connection header)
        closes = b"connection" in names and any(
            b"close" in [t.lower().strip() for t in value.split(b",")]
            for name, value in zip(names, values, strict=True)
            if name == b"connection"
        )
        if closes:
            cycle.keep_alive = False
        # (each line "name: value" and its CRLF: the empty string last ends the last one)
        lines = b"\r\n".join([*map(_HEADER, zip(names, values, strict=True)), b""])
        out = [STATUS_LINE[status], lines]
        if not cycle.keep_alive and not closes:
            out.append(b"connection: close\r\n")
        if framing == b"transfer-encoding":
            out.append(b"transfer-encoding: chunked\r\n")
        out.append(b"\r\n")
        cycle.response_started, cycle.waiting_for_100_continue = True, False
        return b"".join(out)

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """A whole answer, `headers` without its content-length (added here), written as
        `send` writes an `http.response.start` and an `http.response.body` message that ends
        it, with the cycle's state left as `send` leaves it. False, nothing written, where
        `send` must do it (`_head_bytes` says when)."""
        cycle = self._cycle
        if cycle.disconnected:
            return not cycle.response_started  # as `send` then: nothing written
        every = [*cycle.default_headers, *headers, (b"content-length", b"%d" % len(body))]
        head = self._head_bytes(status, every, b"content-length")
        if head is None:
            return False
        cycle.chunked_encoding, cycle.expected_content_length = False, 0
        self._transport.write(head + body)
        self._completed()
        return True

    async def drain(self) -> None:
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()

    # -- held: a context manager of its own (a generator's costs a few us per answer) ---------
    def held(self) -> ConnectionWriter:
        return self

    def __enter__(self) -> None:
        cycle = self._cycle
        self._transport, self._head = cycle.transport, None
        cycle.transport = self  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        transport = self._transport
        self._cycle.transport = transport
        head, self._head = self._head, None
        if head and not transport.is_closing():  # a start and no body after it
            transport.write(head)

    def write(self, data: bytes) -> None:
        """The transport's `write` while held: the first write waits for the next."""
        head = self._head
        if head is None:
            self._head = data
            return
        self._head = b""
        self._transport.write(head + data if head else data)

    def __getattr__(self, name: str) -> Any:  # the rest of the transport, while held
        return getattr(self._transport, name)


class Guard:
    """One per server: the client limits, and counts of refusals for the periodic log line."""

    def __init__(self, limits: ServerConfig) -> None:
        self.limits = limits
        self.refused: Counter[str] = Counter()


class GatewayConfig(uvicorn.Config):
    """uvicorn's config, carrying the guard to each connection's protocol."""

    def __init__(self, app: Any, guard: Guard, **kwargs: Any) -> None:
        super().__init__(app, http=GatewayProtocol, **kwargs)
        self.guard = guard


class _Refusal(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def _error_response(status: int, message: str, state: ServerState) -> bytes:
    body = error_json(status, message)
    out = [STATUS_LINE[status]]
    for name, value in state.default_headers:
        out += [name, b": ", value, b"\r\n"]
    if status == 503:
        out.append(b"retry-after: 1\r\n")
    out += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
            b"\r\nconnection: close\r\n\r\n", body]  # fmt: skip
    return b"".join(out)


class GatewayProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        assert isinstance(config, GatewayConfig)
        self.guard = config.guard
        self.limits = config.guard.limits
        self.deadline = 0.0  # loop time; 0: none (between a body's end and the response's)
        self.in_head = True  # reading a request line and headers
        self.head_bytes = 0  # raw bytes received since the head began (body bytes may follow)
        self.over_limit = False
        self.closing = False  # refused: dropping what comes until the linger ends
        self.idle = False  # kept alive between requests: the deadline is the keep-alive's

    # -- phases ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.over_limit = len(self.connections) > self.limits.max_connections
        self.deadline = self.loop.time() + self.limits.header_timeout_s

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.idle or (
            self.deadline == 0.0 and (self.cycle is None or self.cycle.response_complete)
        ):
            # A kept-alive connection's next request begins. (No keep-alive timer of
            # uvicorn's to stop: `on_response_complete` arms none.)
            self.idle = False
            self.deadline = self.loop.time() + self.limits.header_timeout_s
            self.in_head, self.head_bytes = True, 0
        if self.in_head:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as e:
            if isinstance(e.__context__, _Refusal):  # raised by on_headers_complete
                self.refuse(e.__context__)
            else:
                self.refuse(_Refusal(400, "Invalid HTTP request.", "invalid_http"))
            return
        if self.in_head and self.head_bytes > self.limits.max_header_bytes:
            self.refuse(self._too_large())

    def on_headers_complete(self) -> None:
        if self.head_bytes > self.limits.max_header_bytes and self._head_size() > (
            self.limits.max_header_bytes
        ):
            raise self._too_large()
        if self.over_limit:
            raise _Refusal(503, f"The gateway serves at most {self.limits.max_connections} "
                           "connections at once; retry shortly.", "max_connections")  # fmt: skip
        self.in_head = False
        self.deadline = self.loop.time() + self.limits.body_timeout_s
        self.scope[CLIENT_GONE] = []  # type: ignore[literal-required]
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # (not an upgrade)
            self.scope[CONNECTION_WRITER] = ConnectionWriter(cycle)  # type: ignore[literal-required]

    def on_message_complete(self) -> None:
        self.deadline = 0.0
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not self.transport.is_closing():
            self._keep_alive()  # answered before its body was read whole: the wait begins now

    def on_response_complete(self) -> None:
        """uvicorn's, with the wait for a kept-alive connection's next request a deadline the
        sweep enforces, as the head's and the body's are, instead of a timer armed after every
        answer and cancelled by the next request (`call_later` and `cancel` per request)."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # pipelined requests: the next one starts
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self.deadline == 0.0:  # the request was read whole (else: on_message_complete)
            self._keep_alive()

    def _keep_alive(self) -> None:
        self.idle = True
        self.deadline = self.loop.time() + self.timeout_keep_alive

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline, self.closing = 0.0, True
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and cycle.disconnected:
            self._client_gone(cycle)

    @staticmethod
    def _client_gone(cycle: RequestResponseCycle) -> None:
        hooks: list[Callable[[], None]] = cycle.scope.get(CLIENT_GONE) or []  # type: ignore[assignment]
        while hooks:
            hooks.pop()()

    # -- deadlines and refusals ----------------------------------------------------------------
    def expire(self, now: float) -> None:
        """Called by the server's sweep: act on a deadline that has passed."""
        if self.deadline == 0.0 or now < self.deadline:
            return
        self.deadline = 0.0
        if self.closing or self.idle:  # (idle: the keep-alive timeout, as uvicorn's timer)
            self.transport.close()
        elif self.in_head and self.head_bytes == 0:
            self.guard.refused["silent"] += 1
            self.transport.close()
        elif self.in_head:
            timeout = self.limits.header_timeout_s
            self.refuse(_Refusal(408, f"Request headers not received within {timeout:g} s.",
                                 "header_timeout"))  # fmt: skip
        else:
            timeout = self.limits.body_timeout_s
            self.refuse(_Refusal(408, f"Request body not received within {timeout:g} s.",
                                 "body_timeout"))  # fmt: skip

    def refuse(self, why: _Refusal) -> None:
        """Answer with an OpenAI error (when no response is under way), then close, lingering."""
        self.guard.refused[why.reason] += 1
        log.debug("client refused", extra={"fields": {
            "reason": why.reason, "status": why.status, "client": _peer(self.client)}})  # fmt: skip
        cycle = self.cycle
        # In a head, any earlier response on the connection is complete: an answer may go.
        answer = self.in_head or cycle is None or not cycle.response_started
        if cycle is not None and not cycle.response_complete:
            # The app, if it runs, sees a disconnect and its sends go nowhere.
            cycle.disconnected = True
            cycle.message_event.set()
            self._client_gone(cycle)
        if answer:
            self.transport.write(_error_response(why.status, why.message, self.server_state))
        self.closing = True
        self.deadline = self.loop.time() + LINGER_S
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self.refuse(_Refusal(400, "Invalid HTTP request.", "invalid_http"))

    def _too_large(self) -> _Refusal:
        limit = self.limits.max_header_bytes
        return _Refusal(431, f"Request headers exceed the {limit}-byte limit.", "header_size")

    def _head_size(self) -> int:
        url = getattr(self, "url", b"")
        return len(url) + 16 + sum(len(n) + len(v) + 4 for n, v in self.headers or ())


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "-"


class GatewayServer(uvicorn.Server):
    def __init__(
        self,
        config: GatewayConfig,
        drain: Drain,
        shutdown: ShutdownConfig,
        hangup: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(config)
        self.guard = config.guard
        self.drain, self.stopping = drain, shutdown
        self.signals = 0
        self.hurry = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self._drainer: asyncio.Task[None] | None = None
        self.hangup = hangup  # what SIGHUP does (the app's reload)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The runner handles SIGTERM and SIGINT itself (`listen`).
        yield

    def listen(self) -> None:
        """Handle SIGTERM, SIGINT and SIGHUP on the running loop (main thread only)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self.on_hangup)

    def on_hangup(self) -> None:
        """SIGHUP: the app rereads its config file (gateway.serve.admin); nothing stops."""
        log.info("SIGHUP: reloading the config file")
        self.hangup()

    def on_signal(self, sig: int) -> None:
        self.signals += 1
        if not self.started:  # still starting: nothing to drain
            self.should_exit = True
        elif self.signals == 1:
            self._drainer = self._spawn(self._drain(signal.Signals(sig).name))
        elif self.signals == 2:
            log.info("second signal: ending every request now")
            self.hurry.set()
        else:
            self.force_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._spawn(self._sweep())

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
            if self._drainer is not None:  # its last word: drained, or how many were cut
                await asyncio.wait({self._drainer}, timeout=1.0)
        finally:
            for task in list(self._background):
                task.cancel()
            if self.guard.refused:
                log.info("clients refused", extra={"fields": dict(self.guard.refused)})

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _drain(self, signame: str) -> None:
        cfg = self.stopping
        self.drain.begin()
        log.info("draining (a second signal ends it now)", extra={"fields": {
            "signal": signame, "in_flight": len(self.drain.live),
            "pre_stop_delay_s": cfg.pre_stop_delay_s, "drain_timeout_s": cfg.drain_timeout_s,
        }})  # fmt: skip
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.hurry.wait(), cfg.pre_stop_delay_s)
        # uvicorn closes the listener and idle connections; busy ones close after their answer.
        self.should_exit = True
        started = time.monotonic()
        drained = await self.drain.settle(cfg.drain_timeout_s, self.hurry)
        waited = round(time.monotonic() - started, 3)
        if drained:
            log.info("drained", extra={"fields": {"waited_s": waited}})
            return
        cut = self.drain.cut(CUT_REASON)
        log.warning("drain timeout: ending the requests still in flight", extra={"fields": {
            "cut": cut, "waited_s": waited}})  # fmt: skip

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        reported = loop.time()
        while True:
            await asyncio.sleep(SWEEP_S)
            now = loop.time()
            for conn in list(self.server_state.connections):
                if isinstance(conn, GatewayProtocol):
                    conn.expire(now)
            if self.guard.refused and now - reported >= REPORT_S:
                reported = now
                log.info("clients refused", extra={"fields": dict(self.guard.refused)})
                self.guard.refused.clear()


class ServedApp(Protocol):
    """What the server needs of the app it serves (gateway.serve.app.GatewayApp): an ASGI app, its
    shutdown state, and what reloads its configuration on SIGHUP."""

    @property
    def drain(self) -> Drain: ...

    def hangup(self) -> None: ...

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None: ...


def build_server(settings: Settings, app: ServedApp) -> GatewayServer:
    """The server for `app`, as `settings` say (it binds host and port itself unless given
    sockets: `run_server`)."""
    config = GatewayConfig(
        app,
        Guard(settings.server),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        # uvicorn's few lines go through the gateway's own (structured) logging.
        log_config=None,
        access_log=False,
        # The app reads no client address; X-Forwarded-For rewriting costs every request.
        proxy_headers=False,
        loop="uvloop",
        timeout_keep_alive=settings.server.keepalive_timeout_s,
        # A last resort only: the drain ends every request at its own deadline.
        timeout_graceful_shutdown=settings.shutdown.drain_timeout_s + CUT_GRACE_S,
    )
    server = GatewayServer(config, app.drain, settings.shutdown, app.hangup)
    # Each client connection may hold an engine connection too.
    raise_fd_limit(2 * settings.server.max_connections + 256)
    return server


async def run_server(
    server: GatewayServer,
    sockets: list[socket.socket] | None = None,
    started: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve until the drain ends (on `sockets` if given, else the configured host and port);
    `started` is awaited once the server accepts connections."""
    task = asyncio.create_task(server.serve(sockets))
    while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn has no event)
        await asyncio.sleep(0.05)
    if server.started:
        # Objects alive after start-up (the app's lifespan built the gateway) live for the
        # whole process: keep them out of the collector's full passes, which otherwise
        # showed up as 30-90 ms stalls in the latency tail.
        gc.collect()
        gc.freeze()
        if started is not None:
            await started()
    await task


def raise_fd_limit(wanted: int) -> None:
    """Raise the soft limit on open files towards `wanted` (at most the hard limit): the usual
    soft limit of 1,024 would refuse connections (EMFILE) long before `max_connections`."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
