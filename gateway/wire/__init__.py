"""Wire adapters: the engine's protocol behind one small interface, chosen per backend by its
`kind`.

A kind is a module of this package that defines `ADAPTER`: `vllm` (OpenAI API, passed through
unchanged) and `triton` (Triton's generate API, translated both ways). Adding an engine kind
(SGLang, TGI, llama.cpp's server) is adding one module here; the configuration accepts its name
as a backend's `kind` from then on.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol

from gateway.wire.metrics import EngineStats

if TYPE_CHECKING:
    from gateway.core.exchange import Exchange

__all__ = ["BackendOptions", "Incompatible", "StreamRelay", "WireAdapter", "adapter", "kinds"]


class Incompatible(NamedTuple):
    """Why a request cannot go to backends of some kind."""

    param: str | None
    message: str


class BackendOptions(Protocol):
    """What an adapter reads of its backend's configuration (config.settings.BackendConfig)."""

    @property
    def priority_scheduling(self) -> bool: ...

    @property
    def triton_models(self) -> Mapping[str, str]: ...


class StreamRelay(Protocol):
    """One attempt's stream: the engine's bytes in, the client's bytes out, with the counts
    telemetry needs."""

    text_events: int  # events that carried generated text
    completion_tokens: int | None  # from usage, when the stream reported it
    engine_error: bool  # the engine sent an error event of its own

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        """Bytes for the client from `chunk`, and whether `chunk` carried generated text."""
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
    # False when every request the gateway accepts can go to this kind (no need to ask).
    restricts: bool
    # Statuses this kind answers the client's mistakes with too (Triton answers a bad sampling
    # parameter 500): passed on as they are, neither retried nor held against the backend.
    ambiguous: frozenset[int]

    def parse_metrics(self, text: str) -> Mapping[str, EngineStats]: ...

    def incompatibility(self, ex: Exchange) -> Incompatible | None:
        """None when this kind of backend can serve `ex`."""
        ...

    def request(self, ex: Exchange, backend: BackendOptions) -> tuple[str, bytes]:
        """The path (after the backend's base URL) and body of the upstream request."""
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


def kinds() -> tuple[str, ...]:
    """The engine kinds this installation has an adapter for."""
    names = (m.name for m in pkgutil.iter_modules(__path__))
    return tuple(sorted(n for n in names if not n.startswith("_")))


def adapter(kind: str) -> WireAdapter:
    """The adapter of `kind` (a module of this package)."""
    if kind not in kinds():
        raise ValueError(f"no wire adapter for engine kind {kind!r}; known: {', '.join(kinds())}")
    found: WireAdapter = importlib.import_module(f"{__name__}.{kind}").ADAPTER
    return found
