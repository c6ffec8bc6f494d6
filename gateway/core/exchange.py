"""The request object: one `Exchange` per proxied request, from the first byte read to the
record written.

Each stage of the path fills in its part and hands the same object on:
intake (id, headers, body, parsed fields, model, pin, exclusions) -> admission (the routing
decision) -> upstream (attempts, the backend that answered, status, stream timings, tokens) ->
telemetry (reads it all). A new per-request fact is a new field here, not a new parameter on
every function of the path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.routing import Backend, Decision, Role, RouteRequest, RouterState, Slo

__all__ = [
    "NO_DECISION",
    "Allowance",
    "Caller",
    "ConnectionWriter",
    "Endpoint",
    "Exchange",
    "Send",
    "Trace",
    "Variant",
    "body_of",
]  # fmt: skip

# What the request path reads of the parts that fill an exchange in from above it (tenants,
# gray releases, tracing): declared here, as their consumer sees them, so that the request
# object imports none of them.


class Allowance(Protocol):
    """A caller's limits (gateway.config.settings.LimitsConfig); None: none of that kind."""

    @property
    def requests_per_minute(self) -> int | None: ...

    @property
    def tokens_per_minute(self) -> int | None: ...

    @property
    def max_concurrent(self) -> int | None: ...


class Caller(Protocol):
    """Who asked (gateway.pipeline.tenants.Tenant)."""

    @property
    def name(self) -> str: ...

    @property
    def rank(self) -> int: ...  # priority: higher goes first

    @property
    def limits(self) -> Allowance: ...

    @property
    def limited(self) -> bool: ...


class Variant(Protocol):
    """The gray release's variant serving a request (gateway.pipeline.releases.Variant)."""

    @property
    def release(self) -> str: ...  # the model name clients ask for

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...  # the model name its backends serve


class Trace(Protocol):
    """A request's spans (gateway.pipeline.tracing.RequestTrace), as the request path opens them."""

    async def admit(self, admitting: Awaitable[Decision]) -> Decision: ...

    def route(self, decide: Callable[[RouteRequest], Decision], req: RouteRequest) -> Decision:
        ...

    def attempt(self, ex: Exchange, backend: Backend) -> AbstractContextManager[None]: ...

    def streaming(self) -> None: ...

    def inject(self, headers: dict[str, str]) -> None: ...

    def end(self, ex: Exchange) -> None: ...


Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ConnectionWriter(Protocol):
    """The server's direct writes to the client's connection (gateway.serve.server), for what
    the gateway writes most: a stream's chunks (one per chunk the engine sends, so what it
    saves is saved per token), its start and end, and whole answers (one write instead of
    two)."""

    def chunk(self, body: bytes) -> bool:
        """What an ASGI `http.response.body` message with more to come does, without the
        message: `body` (not empty) as a chunk of the chunked answer in progress. True when the
        client reads slower than it is written: `drain` before the next."""
        ...

    async def drain(self) -> None: ...

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """A whole answer (its content-length added) in one write, without ASGI messages;
        False, nothing written, where only `send` can write it."""
        ...

    def begin(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """A chunked answer's start (its transfer-encoding added), held for the first `chunk`,
        `end` or `flush`; False, nothing written, where only `send` can write it."""
        ...

    def flush(self) -> None:
        """The start `begin` held, written now (nothing when none is held)."""
        ...

    def end(self, tail: bytes) -> None:
        """What an `http.response.body` message that ends a chunked answer does: `tail` (may
        be empty) as its last chunk, and its end."""
        ...

    def held(self) -> AbstractContextManager[None]:
        """While in it, the answer's start (status line, headers) is held and written with the
        body's first bytes."""
        ...


# Where the server writes nothing past `send`: an answer's start goes out when sent.
_NOT_HELD: AbstractContextManager[None] = contextlib.nullcontext()
DEFAULT_SLO = Slo()
# A prompt's tokens estimated from its body's bytes (the usual four per token of English text
# and JSON; the body's own JSON counted too).
_BYTES_PER_TOKEN = 4
# What an exchange holds until routing has decided: no candidates, no policy.
NO_DECISION = Decision(candidates=(), reason="", policy="", state=RouterState())


def body_of(data: Mapping[str, Any]) -> bytes:
    """A request body the gateway changed (gray releases' model, vLLM's priority, usage asked
    for), as sent: compact JSON. Unchanged bodies go as the client sent them."""
    return json.dumps(data, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One proxied OpenAI endpoint."""

    path: str  # as the engines serve it, e.g. /v1/completions
    chat: bool


@dataclass(slots=True, eq=False)
class Exchange:
    id: str
    endpoint: Endpoint
    headers: dict[bytes, bytes]  # the client's, names lower-case (as ASGI gives them)
    send: Send  # the client's ASGI send
    started: float  # perf_counter at arrival
    task: asyncio.Task[Any] | None = None  # the task serving this request (what a cut cancels)
    # -- intake: what the client asked for
    tenant: Caller | None = None  # who asked (gateway.pipeline.tenants); set once authenticated
    # vLLM's `priority` for engines with priority scheduling (lower runs first); None: none.
    priority: int | None = None
    limited: bool = False  # holds a place in its tenant's limits (pipeline.limits) until over
    usage_tokens: int = 0  # prompt + completion tokens of the answer's usage, when watched
    body: bytes = b""  # forwarded unchanged to pass-through engines
    data: dict[str, Any] = field(default_factory=dict)  # the body, parsed
    model: str = ""
    stream: bool = False
    pinned: Role | None = None  # x-tiergate-tier
    exclude: frozenset[str] = frozenset()  # backends that cannot serve this request
    slo: Slo = DEFAULT_SLO  # the configured default, or x-tiergate-slo-ttft-ms / -tpot-ms
    affinity: int | None = None  # the prefix-cache affinity key (gateway.routing.affinity)
    session: bool = False  # the key names a session the client declared
    # The backend that served the key last (pipeline.homes); None: not seen, or in use now.
    home: str | None = None
    variant: Variant | None = None  # the gray release's variant serving it (pipeline.releases)
    mirror: Variant | None = None  # where a shadow copy of it goes (None: nowhere)
    shadow: bool = False  # it is a shadow copy: its answer goes nowhere
    # Per-request work a wire adapter did once for all attempts (e.g. a translated body).
    prepared: dict[str, object] = field(default_factory=dict)
    # -- admission
    decision: Decision = NO_DECISION
    # -- upstream: what happened
    displaced: bool = False  # its last attempt gave its place to a higher priority's request
    attempts: int = 0
    backend: Backend | None = None  # the backend whose answer the client got
    status: int = 0
    first_text_at: float | None = None  # perf_counter of the first chunk carrying text
    last_text_at: float | None = None
    output_tokens: int | None = None  # from the stream's usage, when it had one
    text_events: int = 0
    midstream_error: str | None = None
    # For the latency model: the answering backend's lease count when this attempt joined it,
    # and its lease-count integral at the first byte (a mark, see BackendEntry.busy_mark).
    joined_at_load: int = 0
    busy_mark: tuple[float, float] | None = None
    responded: bool = False  # the response has started: no other answer can be given now
    # Continuation of a stream that broke: what the client was sent (None: not kept, the
    # request cannot be continued), how many times it was continued, and the backends that
    # failed it.
    transcript: list[bytes] | None = None
    continuations: int = 0
    failed_urls: set[str] = field(default_factory=set)
    server_errors: int = 0  # engines' 5xx answers to this request, before its first byte
    # Why the gateway itself is ending this request (e.g. its drain deadline passed): set it,
    # then cancel the request's task; upstream ends the answer cleanly with this message.
    cut_reason: str | None = None
    # Its spans, when tracing is on (gateway.pipeline.tracing); None: nothing on the path traces.
    trace: Trace | None = None
    # -- the answer on its way out
    # What its body goes through to the client, in order, chunk by chunk (whole SSE events of a
    # stream): those that read it (usage, for limits) before those that change it (the usage
    # events the client did not ask for taken out). Filters of the usage only: a stream's
    # events reach them where they hold a usage object (StreamRelay.carried_usage).
    body_filters: list[Callable[[bytes], bytes]] = field(default_factory=list)
    # The server's direct writes to the client (None: ASGI messages only).
    writer: ConnectionWriter | None = None
    # Headers a stage puts on whatever answer the request gets (rate limits), after its own.
    added_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def set_field(self, key: str, value: object) -> None:
        """Change a field of the request as the engines will get it (the body re-encoded)."""
        self.data[key] = value
        self.body = body_of(self.data)

    async def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Send the status line and headers; the body follows with `send`."""
        self.responded = True
        if self.added_headers:
            headers = [*headers, *self.added_headers]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def start_stream(self, headers: list[tuple[bytes, bytes]]) -> None:
        """A 200 stream's status line and headers; its chunks follow (`writer.chunk` or
        `send`). Held for the first chunk where the server can (`ConnectionWriter.begin`):
        the caller writes a chunk or `writer.flush()`es before it waits for anything."""
        if self.writer is not None and self.writer.begin(
            200, [*headers, *self.added_headers] if self.added_headers else headers
        ):
            self.responded = True
            return
        await self.start_response(200, headers)

    async def end_stream(self, tail: bytes) -> None:
        """A stream's last bytes (through `body_filters`) and its end."""
        if self.writer is not None:
            self.writer.end(self.filtered(tail) if tail else tail)
            return
        if tail:
            await self.send_body(tail, more=True)
        await self.send_body(b"")

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole response: `headers` get its content-length. Written in one piece where the
        server can (its start held for its body)."""
        body = self.filtered(body)
        if self.writer is not None and self.writer.whole(
            status, [*headers, *self.added_headers] if self.added_headers else headers, body
        ):
            self.responded = True
            return
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        with _NOT_HELD if self.writer is None else self.writer.held():
            await self.start_response(status, headers)
            await self.send({"type": "http.response.body", "body": body})

    def filtered(self, body: bytes) -> bytes:
        """`body` through `body_filters`."""
        for f in self.body_filters:
            body = f(body)
        return body

    async def send_body(self, body: bytes, more: bool = False) -> None:
        """Body bytes to the client, through `body_filters`; `more`: more follow."""
        await self.send({"type": "http.response.body", "body": self.filtered(body),
                         "more_body": more})  # fmt: skip

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first text of a stream (None: no text streamed)."""
        return None if self.first_text_at is None else self.first_text_at - self.started

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (vllm bench serve's TPOT), counted by the
        stream's usage, else by its text events; None for fewer than two. With `n` choices the
        engine decodes n sequences side by side, a token of each a step: a choice's tokens."""
        tokens = self.output_tokens or self.text_events
        n = self.data.get("n")
        if isinstance(n, int) and n > 1:
            tokens //= n
        if tokens < 2 or self.first_text_at is None or self.last_text_at is None:
            return None
        return (self.last_text_at - self.first_text_at) / (tokens - 1)

    def route_request(self) -> RouteRequest:
        """The features routing may look at (the prompt's size and the answer's limit only
        where the request has a home: only a move off it reads them)."""
        home, size, limit = self.home, 0, 0
        if home is not None:
            size = len(self.body) // _BYTES_PER_TOKEN
            said = self.data.get("max_tokens") or self.data.get("max_completion_tokens")
            limit = said if type(said) is int and said > 0 else 0
        return RouteRequest(
            self.model, self.pinned, self.stream, self.exclude, self.slo, self.affinity, home,
            self.session, size, limit,
        )  # fmt: skip

    @property
    def response_headers(self) -> list[tuple[bytes, bytes]]:
        """Headers every answer to this request carries, whoever gives it."""
        if self.variant is None:
            return [(b"x-request-id", self.id.encode("latin-1"))]
        return [(b"x-request-id", self.id.encode("latin-1")),
                (b"x-tiergate-variant", self.variant.name.encode("latin-1"))]  # fmt: skip
