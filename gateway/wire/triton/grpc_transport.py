"""Triton's gRPC stream as a transport of pipeline.upstream: `post` a generate request, get an
answer whose bytes are those of Triton's HTTP generate API (gateway.wire.triton.grpc_codec), through
tritonclient's asyncio client (`stream_infer`, ModelStreamInfer).

Every request, streamed or not, goes through ModelStreamInfer: the vLLM backend is decoupled,
and Triton refuses ModelInfer for decoupled models. A non-streamed request sets `stream` false
and gets one response. One call per request, its request stream held open until the last
response (Triton serves a decoupled request only while its stream is open).

As over HTTP, where Triton sends the status with the first response, `post` returns once the
first response is in. Failures are aiohttp's exception types, as gateway.core.http1's: a call that
cannot reach the server (UNAVAILABLE) is a connection error, so the attempt moves on to the next
backend; a call the server fails with another code is an answer with the HTTP status Triton's
HTTP front gives the same error; a stream broken after its first response is a payload error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import grpc
import numpy as np
import tritonclient.grpc.aio as triton_aio
from multidict import CIMultiDict, CIMultiDictProxy
from tritonclient.grpc import InferInput

from gateway.wire.triton.grpc_codec import (
    GrpcRequest,
    error_body,
    grpc_metadata,
    grpc_request,
    response_body,
    status_of_code,
    status_of_message,
)

__all__ = ["GrpcResponse", "TritonGrpc"]

_CLOSED = "Connection closed"
_JSON: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"}))
_SSE: CIMultiDictProxy[str] = CIMultiDictProxy(
    CIMultiDict({"Content-Type": "text/event-stream; charset=utf-8"})
)


def _input(name: str, datatype: str, value: str | bool) -> InferInput:
    tensor = InferInput(name, [1], datatype)
    if datatype == "BYTES":
        tensor.set_data_from_numpy(np.array([str(value).encode()], dtype=np.object_))
    else:
        tensor.set_data_from_numpy(np.array([bool(value)], dtype=np.bool_))
    return tensor


class GrpcResponse:
    """One ModelStreamInfer call read as an HTTP answer (core.transport.UpstreamResponse)."""

    __slots__ = ("_call", "_closed", "_done", "_end", "_failed", "_first", "_streaming",
                 "_timeout_s", "headers", "status")  # fmt: skip

    def __init__(self, call: Any, end: asyncio.Event, req: GrpcRequest, timeout_s: float) -> None:
        self._call, self._end, self._timeout_s = call, end, timeout_s
        self._streaming = req.streaming
        self.status = 200
        self.headers = _SSE if req.streaming else _JSON
        self._first = b""
        self._done = False  # the last response is in (or the call ended)
        self._closed = False
        self._failed: str | None = None  # a response's error message

    @property
    def content(self) -> GrpcResponse:
        return self

    async def start(self) -> None:
        """Wait for the first response: it sets the status (as Triton's HTTP front does)."""
        try:
            self._first = await self._next()
            if self._failed is not None:
                self.status = status_of_message(self._failed)
        except grpc.aio.AioRpcError as e:
            self._finish()
            code = e.code()
            if code is grpc.StatusCode.UNAVAILABLE:
                raise aiohttp.ClientConnectionError(f"gRPC UNAVAILABLE: {e.details()}") from None
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise aiohttp.ServerTimeoutError(f"gRPC DEADLINE_EXCEEDED: {e.details()}") from None
            self.status = status_of_code(code.name)
            self._first = error_body(e.details() or code.name, self._streaming)
        if not self._first and self._done:
            raise aiohttp.ClientPayloadError("the gRPC stream ended without a response")

    async def _next(self) -> bytes:
        """The next response's bytes; b"" once the call is over."""
        if self._done:
            return b""
        try:
            async with asyncio.timeout(self._timeout_s):
                result, error = await self._call.__anext__()
        except StopAsyncIteration:
            self._finish()
            return b""
        if error is not None:
            self._finish()
            self._failed = message = error.message()
            return error_body(message, self._streaming)
        body, final = response_body(result.get_response(), self._streaming)
        if final:
            self._finish()
        return body

    async def readany(self) -> bytes:
        if self._first:
            data, self._first = self._first, b""
            return data
        try:
            return await self._next()
        except TimeoutError:
            self._abort()
            raise aiohttp.ServerTimeoutError("no gRPC response within the read timeout") from None
        except grpc.aio.AioRpcError as e:
            self._finish()
            if self._closed:
                raise aiohttp.ClientConnectionError(_CLOSED) from None
            raise aiohttp.ClientPayloadError(
                f"gRPC stream failed: {e.code().name}: {e.details()}"
            ) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                raise aiohttp.ClientConnectionError(_CLOSED) from None  # close(), not our task
            raise

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        if not self._done:
            self._abort()

    def close(self) -> None:
        if not self._done:
            self._closed = True
            self._abort()

    def _finish(self) -> None:
        self._done = True
        self._end.set()  # the request stream ends: the call completes

    def _abort(self) -> None:
        self._finish()
        self._call.cancel()


class TritonGrpc:
    """The transport of one Triton backend's gRPC endpoint (`target`, host:port). Its client is
    made in the running loop on first use (a gRPC channel belongs to one loop)."""

    def __init__(self, target: str, read_timeout_s: float) -> None:
        self.target, self.read_timeout_s = target, read_timeout_s
        # Each model's inputs from its metadata (set by the readiness check): a return_* flag
        # a model does not declare is not sent.
        self.declared: dict[str, frozenset[str]] = {}
        self._client: triton_aio.InferenceServerClient | None = None

    def client(self) -> triton_aio.InferenceServerClient:
        if self._client is None:
            self._client = triton_aio.InferenceServerClient(self.target)
        return self._client

    async def post(
        self, base: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> GrpcResponse:
        """Send the generate request (`path`, `body`) the adapter built for `base`'s HTTP API
        over gRPC instead; the answer once its first response is in."""
        req = grpc_request(path, body, self.declared)
        request: dict[str, Any] = {
            "model_name": req.model,
            "inputs": [_input(*t) for t in req.tensors],
            "request_id": req.request_id,
            "parameters": dict(req.parameters),
        }
        end = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield request
            await end.wait()

        call = self.client().stream_infer(requests(), headers=grpc_metadata(headers))
        resp = GrpcResponse(call, end, req, self.read_timeout_s)
        try:
            await resp.start()
        except BaseException:
            resp.release()
            raise
        return resp

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
