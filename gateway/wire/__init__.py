"""Engine kinds: each engine's protocol behind one small interface, chosen per backend by its
`kind`.

A kind is one folder under this package whose `KIND` is an `EngineKind`: its wire adapter
(requests, answers, streams and metrics translated to and from the OpenAI API), the options its
backends take, and, where it has them, a transport of its own and a readiness check. `vllm`
passes the OpenAI API through unchanged; `triton` translates Triton's generate API both ways
(and may speak its gRPC stream). `gateway.wire.kinds.BUILTIN` names the kinds the gateway ships;
the assembly takes the kinds it serves as an argument, so a new kind (SGLang, TGI, llama.cpp's
server) is a folder and a name in that table, and no other module changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pydantic import BaseModel

from gateway.core.transport import Transport
from gateway.wire.metrics import EngineStats

if TYPE_CHECKING:
    from gateway.core.exchange import Exchange

__all__ = [
    "EngineKind",
    "Incompatible",
    "Kind",
    "KindBackend",
    "OwnTransport",
    "Readiness",
    "StreamRelay",
    "WireAdapter",
]


class Incompatible(NamedTuple):
    """Why a request cannot go to backends of some kind."""

    param: str | None
    message: str


class StreamRelay(Protocol):
    """One attempt's stream: the engine's bytes in, the client's bytes out, with the counts
    telemetry needs."""

    @property
    def text_events(self) -> int: ...  # events that carried generated text

    @property
    def completion_tokens(self) -> int | None: ...  # from usage, when the stream reported it

    @property
    def engine_error(self) -> bool: ...  # the engine sent an error event of its own

    @property
    def carried_usage(self) -> bool: ...  # what the last `feed` gave out holds a usage object

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        """Bytes for the client from `chunk` (whole SSE events), and whether `chunk` carried
        generated text."""
        ...

    def close(self) -> bytes:
        """The end of a stream the engine closed normally."""
        ...

    def fail(self, message: str, status: int = 502) -> bytes:
        """The end of a stream cut short: an error event with `status` (502: the engine's
        side failed; 503: the gateway is shutting down), then [DONE]."""
        ...


class WireAdapter(Protocol):
    kind: str
    label: str  # how messages name the engine, e.g. "Triton"
    health_path: str  # 200 while the engine can serve
    # The query that asks the engine's metrics page for only the series `parse_metrics` reads
    # (empty: the whole page).
    metrics_query: str
    # False when every request the gateway accepts can go to this kind (no need to ask).
    restricts: bool
    # The engine takes the OpenAI request body as it is (vLLM's API): a continuation, whose
    # body the gateway rebuilds, can go to it.
    passthrough: bool
    # Statuses this kind answers the client's mistakes with too (Triton answers a bad sampling
    # parameter 500): passed on as they are, neither retried nor held against the backend.
    ambiguous: frozenset[int]

    def parse_metrics(self, text: str) -> Mapping[str, EngineStats]: ...

    def incompatibility(self, ex: Exchange) -> Incompatible | None:
        """None when this kind of backend can serve `ex`."""
        ...

    def request(self, ex: Exchange, options: Any) -> tuple[str, bytes]:
        """The path (after the backend's base URL) and body of the upstream request to a
        backend with `options` (an instance of its kind's `options` model)."""
        ...

    def reply(
        self, ex: Exchange, status: int, body: bytes, content_type: bytes
    ) -> tuple[int, bytes, bytes]:
        """A whole (non-streamed, or failed) answer as the client gets it: status, body,
        content type."""
        ...

    def early_error(self, first: bytes) -> tuple[int, bytes] | None:
        """When a 200 stream's first bytes are an error event (the engine failed before it
        generated anything, and its status line had gone out already): the status the event
        names and the error as the client would get it as an answer. None otherwise."""
        ...

    def refused(self, status: int, body: bytes) -> bytes:
        """The body of a retryable refusal (429, 503, ...), as the client would get it."""
        ...

    def relay(self, ex: Exchange) -> StreamRelay: ...


class KindBackend(Protocol):
    """What a kind's transport and readiness check read of their backend."""

    @property
    def url(self) -> str: ...

    @property
    def auth(self) -> Mapping[str, str]: ...

    @property
    def models(self) -> Sequence[str]: ...

    @property
    def options(self) -> Any: ...  # an instance of the kind's `options` model


class OwnTransport(Transport, Protocol):
    """A kind's own way to reach its engine (instead of the gateway's HTTP/1.1 pool), closed
    with the gateway."""

    async def aclose(self) -> None: ...


class Readiness(Protocol):
    """A kind's own health probe, in place of a GET of the adapter's `health_path`."""

    async def check(self) -> tuple[str, bool] | None:
        """None when ready; otherwise why not and whether that is the engine's answer (a hard
        failure) rather than no answer."""
        ...

    async def aclose(self) -> None: ...


class EngineKind(Protocol):
    """One engine kind: everything the gateway knows of that engine, behind one name."""

    @property
    def name(self) -> str: ...  # a backend's `kind` in the configuration

    @property
    def adapter(self) -> WireAdapter: ...

    # The options its backends take, beside the common ones (url, models, ...), flat in the
    # backend's configuration. Validated with the context {"models": the backend's models};
    # a model that forbids extras turns a typo into a configuration error.
    @property
    def options(self) -> type[BaseModel]: ...

    def transport(self, backend: KindBackend, timeout_s: float) -> OwnTransport | None:
        """The backend's own transport, or None for the gateway's HTTP/1.1 pool."""
        ...

    def readiness(
        self, backend: KindBackend, transport: OwnTransport | None, timeout_s: float
    ) -> Readiness | None:
        """The backend's own readiness check (given the transport made for it), or None for a
        GET of the adapter's `health_path`."""
        ...


@dataclass(frozen=True)
class Kind:
    """An EngineKind reached over the gateway's HTTP/1.1 pool and probed with a GET of its
    adapter's `health_path`; a kind with a transport or a readiness check of its own overrides
    `transport` or `readiness`."""

    name: str
    adapter: WireAdapter
    options: type[BaseModel]

    def transport(self, backend: KindBackend, timeout_s: float) -> OwnTransport | None:
        return None

    def readiness(
        self, backend: KindBackend, transport: OwnTransport | None, timeout_s: float
    ) -> Readiness | None:
        return None
