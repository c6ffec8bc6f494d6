"""A Triton backend's readiness and its models' metadata, through tritonclient's asyncio clients
(HTTP, or gRPC where the backend's requests go over gRPC): the monitor's health probe for
backends of kind triton.

Ready means the server is ready and so is every model the gateway maps to it: a model missing
from the repository (or not loaded) takes the backend out of rotation, with an error in the log
that names it. Each probe also reads the models' metadata: inputs unlike the vLLM backend's
(gateway.wire.triton.grpc_codec.input_problems) are logged as an error, and the inputs a model
declares tell the gRPC transport which optional ones it may send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from gateway.wire import KindBackend
from gateway.wire.triton.grpc_codec import input_problems

if TYPE_CHECKING:
    from gateway.wire.triton.grpc_transport import TritonGrpc

__all__ = ["TritonReadiness", "model_inputs"]

log = logging.getLogger(__name__)

# gRPC codes of a server that cannot be reached: like a refused connection, not a "no".
_UNREACHABLE = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")


def model_inputs(metadata: Mapping[str, Any]) -> dict[str, str]:
    """A model's inputs (name -> datatype) from its metadata as JSON."""
    return {str(t.get("name")): str(t.get("datatype")) for t in metadata.get("inputs") or []}


class TritonReadiness:
    """The readiness check of one Triton backend. Its client is made in the running loop."""

    def __init__(self, backend: KindBackend, grpc: TritonGrpc | None, timeout_s: float) -> None:
        self.backend, self.grpc, self.timeout_s = backend, grpc, timeout_s
        mapped = backend.options.triton_models
        self.models = sorted({mapped.get(m, m) for m in backend.models})
        self.protocol = "gRPC" if grpc is not None else "HTTP"
        self._client: Any = None
        self._logged: dict[str, str] = {}  # model -> the problem last logged for it

    def _make_client(self) -> Any:
        if self.grpc is not None:
            # The requests' channel: its readiness is theirs (the transport closes it).
            return self.grpc.client()
        parts = urlsplit(self.backend.url)
        return http_aio.InferenceServerClient(
            parts.netloc + parts.path, ssl=parts.scheme == "https", conn_timeout=self.timeout_s
        )

    async def check(self) -> tuple[str, bool] | None:
        """None when ready; otherwise why not and whether that is the server's answer (a hard
        failure) rather than no answer."""
        if self._client is None:
            self._client = self._make_client()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._check(self._client, self.backend.auth)
        except (aiohttp.ClientError, TimeoutError) as e:
            return type(e).__name__, False
        except InferenceServerException as e:
            if str(e.status()) in _UNREACHABLE:
                # Over HTTP a dead server fails its metrics too, which counts; a gRPC endpoint
                # is checked here alone, and requests cannot reach it.
                return "unreachable", self.grpc is not None
            return f"error {e.message()}", True

    async def _check(self, client: Any, auth: Mapping[str, str]) -> tuple[str, bool] | None:
        headers = dict(auth) or None
        if not await client.is_server_ready(headers=headers):
            return "server not ready", True
        for model in self.models:
            try:
                ready = await client.is_model_ready(model, headers=headers)
            except InferenceServerException as e:
                if str(e.status()) in _UNREACHABLE:
                    raise
                ready = False  # some servers answer NOT_FOUND for a model they do not have
            if not ready:
                why = "is it in the model repository (triton_models maps the gateway's names)?"
                self._report(model, f"model {model!r} is not ready: {why}")
                return f"model {model} not ready", True
            metadata = await client.get_model_metadata(model, headers=headers, **self._as_json)
            inputs = model_inputs(metadata)
            problems = input_problems(inputs)
            self._report(model, "; ".join(problems) and (
                f"model {model!r} does not take the vLLM backend's inputs: "
                + "; ".join(problems)))  # fmt: skip
            if self.grpc is not None:
                self.grpc.declared[model] = frozenset(inputs)
        return None

    @property
    def _as_json(self) -> dict[str, bool]:
        # The gRPC client returns a protobuf unless asked for JSON; the HTTP one has no such flag.
        return {"as_json": True} if self.grpc is not None else {}

    def _report(self, model: str, problem: str) -> None:
        """Log a model's problem once (and once more when it is gone)."""
        before = self._logged.get(model, "")
        if problem == before:
            return
        self._logged[model] = problem
        fields = {"backend": self.backend.url, "model": model, "protocol": self.protocol}
        if problem:
            log.error("Triton backend %s: %s", self.backend.url, problem, extra={"fields": fields})
        else:
            log.info("Triton backend %s: model %r is fine now", self.backend.url, model,
                     extra={"fields": fields})  # fmt: skip

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            if self.grpc is None:
                await client.close()
