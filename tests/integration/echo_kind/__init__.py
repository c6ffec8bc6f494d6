"""A made-up engine kind, `echo`, kept entirely in this folder: the proof that an engine kind is
one folder. Its engine (engine.py) speaks no OpenAI API: POST /echo/generate answers
{"output": ..., "tokens": n}, GET /alive says it lives, and /stats is its metrics page. The kind
translates both ways (adapter.py), takes an option of its own (`echo_prefix`, options.py) and
probes readiness its own way (readiness.py). Nothing under gateway/ names it: the gateway is
handed it by its assembly (`Hosting(kinds=...)`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.wire import Kind, KindBackend, OwnTransport, Readiness
from tests.integration.echo_kind.adapter import ADAPTER
from tests.integration.echo_kind.options import EchoOptions
from tests.integration.echo_kind.readiness import EchoReadiness

__all__ = ["KIND"]


@dataclass(frozen=True)
class EchoKind(Kind):
    """The gateway's HTTP/1.1 pool; a readiness check of its own."""

    def readiness(
        self, backend: KindBackend, transport: OwnTransport | None, timeout_s: float
    ) -> Readiness | None:
        return EchoReadiness(backend.url, timeout_s)


KIND = EchoKind("echo", ADAPTER, EchoOptions)
