"""The gRPC face of the simulator's Triton stand-in (engines.sim.triton): Triton's
GRPCInferenceService on the stubs tritonclient ships, serving the same simulated engine, the
same statistics and faults as the HTTP face, on a port of its own (Triton's 8001).

- ServerLive, ServerReady, ModelReady (not ready under the `unhealthy` fault), ServerMetadata,
  ModelMetadata, ModelConfig;
- ModelStreamInfer: the vLLM backend is decoupled, so a request with `stream` true is answered
  with one response per engine step, the last one marked with the `triton_final_response`
  parameter (as Triton marks the responses of a decoupled model); `stream` false gets one.
  Several requests may share a stream; their responses interleave. Triton's own checks of a
  request (unknown model, an input it does not declare, a wrong datatype) and the backend's
  failures are responses with an `error_message`, the stream going on;
- ModelInfer: refused for the decoupled model, as Triton refuses it.
Tensors arrive as raw contents (what tritonclient sends) or typed contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from engines.front.wire import ApiError
from engines.sim.triton import (
    INPUTS,
    OUTPUTS,
    SERVER_VERSION,
    VERSION,
    Generate,
    TritonError,
    TritonFront,
    _Books,
    generate_of,
)

__all__ = ["serve_grpc"]

_DONE = object()  # a request of the stream is answered whole


class _Metadata:
    """A gRPC call's metadata where admission reads HTTP headers (x-sim-fault, ...)."""

    def __init__(self, context: Any) -> None:
        self.headers: Mapping[str, str] = {
            k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)
        }


def _elements(datatype: str, raw: bytes) -> list[Any]:
    if datatype == "BYTES":
        out, i = [], 0
        while i + 4 <= len(raw):
            (n,) = struct.unpack_from("<I", raw, i)
            out.append(raw[i + 4 : i + 4 + n].decode("utf-8", "replace"))
            i += 4 + n
        return out
    if datatype == "BOOL":
        return [b != 0 for b in raw]
    return []


def _contents(tensor: Any) -> list[Any]:
    if tensor.datatype == "BYTES":
        return [v.decode("utf-8", "replace") for v in tensor.contents.bytes_contents]
    if tensor.datatype == "BOOL":
        return list(tensor.contents.bool_contents)
    return []


def _param(p: Any) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def read_request(request: Any, model: str) -> Generate:
    """Triton's reading of a ModelInferRequest (TritonError(400) where Triton refuses it), then
    the backend's (engines.sim.triton.generate_of)."""
    rid = request.id or "<id_unknown>"
    if request.model_name != model or request.model_version not in ("", VERSION):
        raise TritonError(400, f"Request for unknown model: '{request.model_name}' is not found")
    raw = request.raw_input_contents
    tensors: dict[str, Any] = {}
    for i, tensor in enumerate(request.inputs):
        spec = INPUTS.get(tensor.name)
        if spec is None:
            raise TritonError(400, f"[request id: {rid}] unexpected inference input "
                              f"'{tensor.name}' for model '{model}'")  # fmt: skip
        if tensor.datatype != spec[0]:
            raise TritonError(400, f"[request id: {rid}] inference input '{tensor.name}' "
                              f"data-type is '{tensor.datatype}', but model '{model}' expects "
                              f"'{spec[0]}'")  # fmt: skip
        tensors[tensor.name] = _elements(tensor.datatype, raw[i]) if raw else _contents(tensor)
    params = {k: _param(v) for k, v in request.parameters.items()
              if not k.startswith("triton_")}  # fmt: skip
    return generate_of(tensors, params, request.id or None, model)


def _encode(datatype: str, value: Any) -> bytes:
    if datatype == "BYTES":
        data = str(value).encode()
        return struct.pack("<I", len(data)) + data
    fmt = {"UINT32": "<I", "FP32": "<f"}[datatype]
    return struct.pack(fmt, value)


def infer_response(reply: Mapping[str, Any], final: bool) -> Any:
    """engines.sim.triton.TritonFront.response's outputs as a stream's response."""
    stream = service_pb2.ModelStreamInferResponse()
    out = stream.infer_response
    out.model_name, out.model_version = reply["model_name"], reply["model_version"]
    out.id = reply.get("id", "")
    for name, (datatype, _) in OUTPUTS.items():
        if name in reply:
            out.outputs.add(name=name, datatype=datatype, shape=[1])
            out.raw_output_contents.append(_encode(datatype, reply[name]))
    out.parameters["triton_final_response"].bool_param = final
    return stream


def _failure(message: str, rid: str) -> Any:
    error = service_pb2.ModelStreamInferResponse(error_message=message)
    error.infer_response.id = rid
    error.infer_response.parameters["triton_final_response"].bool_param = True
    return error


class TritonServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, front: TritonFront) -> None:
        self.front = front

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=not self.front.cfg.faults.unhealthy)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ours = request.name == self.front.model and request.version in ("", VERSION)
        return service_pb2.ModelReadyResponse(ready=ours and not self.front.cfg.faults.unhealthy)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(
            name="triton", version=SERVER_VERSION, extensions=["model_configuration", "generate"]
        )

    async def _known(self, request: Any, context: Any) -> None:
        if request.name != self.front.model or request.version not in ("", VERSION):
            message = f"Request for unknown model: '{request.name}' is not found"
            await context.abort(grpc.StatusCode.NOT_FOUND, message)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        await self._known(request, context)
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=self.front.model, versions=[VERSION], platform="vllm",
            inputs=[tensor(name=n, datatype=d, shape=s) for n, (d, s) in INPUTS.items()],
            outputs=[tensor(name=n, datatype=d, shape=s) for n, (d, s) in OUTPUTS.items()],
        )  # fmt: skip

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        await self._known(request, context)
        from tritonclient.grpc import model_config_pb2 as mc

        def dtype(d: str) -> Any:
            return mc.DataType.Value(f"TYPE_{'STRING' if d == 'BYTES' else d}")

        config = mc.ModelConfig(
            name=self.front.model, backend="vllm", max_batch_size=0,
            model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True),
            input=[mc.ModelInput(name=n, data_type=dtype(d), dims=s,
                                 optional=n != "text_input") for n, (d, s) in INPUTS.items()],
            output=[mc.ModelOutput(name=n, data_type=dtype(d), dims=s)
                    for n, (d, s) in OUTPUTS.items()],
        )  # fmt: skip
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "ModelInfer RPC doesn't support models with decoupled transaction "
                            "policy")  # fmt: skip

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        out: asyncio.Queue[Any] = asyncio.Queue()
        headers = _Metadata(context)
        tasks: set[asyncio.Task[None]] = set()

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(self._one(request, headers, out))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)
            out.put_nowait(_DONE)

        reader = asyncio.create_task(read())
        try:
            while (item := await out.get()) is not _DONE:
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _one(self, request: Any, headers: _Metadata, out: asyncio.Queue[Any]) -> None:
        """One request of a stream, its responses put on `out`."""
        front, rid = self.front, request.id
        try:
            gen = read_request(request, front.model)
        except TritonError as e:
            out.put_nowait(_failure(e.message, rid))
            return
        try:
            job, n_prompt = front.job(headers, gen)
        except ApiError as e:
            front.stats.failure["BACKEND"] += 1
            out.put_nowait(_failure(f"Error generating stream: {e.message}", rid))
            return
        books = _Books(front.stats, n_prompt)
        outcome, sent = "CANCELED", 0
        pieces = front.sim.pieces(job, on_start=books.start)
        try:
            if gen.stream:
                async for text, last in pieces:
                    # One token per word, the last step the rest (as the HTTP face counts).
                    n = job.plan.tokens - sent if last else text.count(" ")
                    finish = job.plan.finish_reason if last else None
                    out.put_nowait(infer_response(front.response(gen, job, text, finish, n), last))
                    sent += n
            else:
                text = "".join([p async for p, _ in pieces])
                prefix = gen.text if gen.prepend else ""
                reply = front.response(gen, job, prefix + text, job.plan.finish_reason,
                                       job.plan.tokens)  # fmt: skip
                out.put_nowait(infer_response(reply, True))
                sent = job.plan.tokens
            outcome = "success"
        except ApiError as e:
            outcome = "BACKEND"
            out.put_nowait(_failure(f"Error generating stream: {e.message}", rid))
        finally:
            books.end(outcome, sent)
            await pieces.aclose()


async def serve_grpc(front: TritonFront, host: str, port: int) -> Any:
    """Start the gRPC face on host:port; the caller stops the server it returns."""
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(TritonServicer(front), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    await server.start()
    return server
