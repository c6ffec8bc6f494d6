"""The vllm engine kind: vLLM's OpenAI-compatible server (and anything speaking its API and
metrics: SGLang's and the simulator's fronts), reached over the gateway's HTTP/1.1 pool and
probed with GET /health."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from gateway.wire import KindBackend, OwnTransport, Readiness, WireAdapter
from gateway.wire.vllm.adapter import ADAPTER
from gateway.wire.vllm.options import VllmOptions

__all__ = ["KIND", "VllmKind"]


@dataclass(frozen=True)
class VllmKind:
    name: str = "vllm"
    adapter: WireAdapter = ADAPTER
    options: type[BaseModel] = VllmOptions

    def transport(self, backend: KindBackend, timeout_s: float) -> OwnTransport | None:
        return None

    def readiness(
        self, backend: KindBackend, transport: OwnTransport | None, timeout_s: float
    ) -> Readiness | None:
        return None


KIND = VllmKind()
