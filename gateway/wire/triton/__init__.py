"""The triton engine kind: Triton Inference Server with its vLLM backend. Requests go to its
generate API (adapter), or through its gRPC stream where `triton_grpc` is set (grpc_codec,
grpc_transport); its metrics page is read per `model` (metrics); it is ready when the server and
each model the gateway maps to it are (readiness, through tritonclient)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from gateway.wire import Kind, KindBackend, OwnTransport, Readiness
from gateway.wire.triton.adapter import ADAPTER
from gateway.wire.triton.options import TritonOptions

if TYPE_CHECKING:
    from gateway.wire.triton.grpc_transport import TritonGrpc

__all__ = ["KIND", "TritonKind"]


@dataclass(frozen=True)
class TritonKind(Kind):
    """Its own transport where `triton_grpc` is set; its own readiness check always."""

    def transport(self, backend: KindBackend, timeout_s: float) -> OwnTransport | None:
        target = backend.options.triton_grpc
        if target is None:
            return None
        # Imported here: grpc and tritonclient only load where a backend uses them.
        from gateway.wire.triton.grpc_transport import TritonGrpc

        return TritonGrpc(target, timeout_s)

    def readiness(
        self, backend: KindBackend, transport: OwnTransport | None, timeout_s: float
    ) -> Readiness | None:
        # Imported here: tritonclient only loads where a backend is Triton.
        from gateway.wire.triton.readiness import TritonReadiness

        # The transport this kind made for the backend: its gRPC channel, or None.
        return TritonReadiness(backend, cast("TritonGrpc | None", transport), timeout_s)


KIND = TritonKind("triton", ADAPTER, TritonOptions)
