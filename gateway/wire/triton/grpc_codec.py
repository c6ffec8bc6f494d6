"""Triton's generate request and answers <-> its gRPC stream (ModelStreamInfer), pure, no I/O.

The gRPC path reuses the HTTP path's translation whole (gateway/wire/triton/adapter.py): the
generate
request the adapter built is mapped to an inference request as Triton's own HTTP front maps it
(a key naming a model input becomes a tensor, any other key a request parameter), and each
stream response becomes the bytes `generate`/`generate_stream` would have sent (one JSON object,
or an SSE `data:` event), so the adapter, relay, retries and hedging do not know the difference.

gRPC has no HTTP status: a call that fails carries a status code (mapped below as Triton's HTTP
front maps its errors), a stream response that fails carries only a message. Triton's own checks
of a request (unknown model, inputs) are 400s over HTTP, the backend's failures 500s; the
message says which.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

__all__ = [
    "INPUT_TYPES",
    "REQUIRED_INPUTS",
    "GrpcRequest",
    "decode_outputs",
    "error_body",
    "grpc_metadata",
    "grpc_request",
    "input_problems",
    "response_body",
    "status_of_code",
    "status_of_message",
]

# The vLLM backend's inputs the gateway may send, with their datatypes (src/model.py).
INPUT_TYPES: Mapping[str, str] = MappingProxyType({
    "text_input": "BYTES",
    "stream": "BOOL",
    "sampling_parameters": "BYTES",
    "exclude_input_in_output": "BOOL",
    "return_finish_reason": "BOOL",
    "return_cumulative_logprob": "BOOL",
    "return_logprobs": "BOOL",
    "return_num_input_tokens": "BOOL",
    "return_num_output_tokens": "BOOL",
})  # fmt: skip
# Without these a model cannot serve the gateway's requests; the return_* flags are optional
# (older backends lack them: finish reason and usage are then inferred).
REQUIRED_INPUTS = ("text_input", "stream", "sampling_parameters", "exclude_input_in_output")
# grpc.StatusCode name -> HTTP status, as Triton's HTTP front maps the same errors. 401/403
# keep their meaning for the gateway (the backend refused its credentials).
_CODES: Mapping[str, int] = MappingProxyType({
    "INVALID_ARGUMENT": 400,
    "OUT_OF_RANGE": 400,
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "UNKNOWN": 500,
    "DATA_LOSS": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
})  # fmt: skip
# The starts of the messages of Triton's own request checks (core, before the backend).
_CORE_CHECKS = (
    "Request for unknown model",
    "[request id:",  # "... expected number of inputs ...", "... unexpected inference input ..."
    "unexpected inference input",
    "expected number of inputs",
    "parameter '",
    "inference input '",
)
_NUMERIC: Mapping[str, str] = MappingProxyType({
    "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q",
    "INT8": "b", "INT16": "h", "INT32": "i", "INT64": "q", "FP32": "f", "FP64": "d",
})  # fmt: skip
_CONTENTS: Mapping[str, str] = MappingProxyType({
    "BOOL": "bool_contents", "BYTES": "bytes_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
})  # fmt: skip
_MODEL_PREFIX = "/v2/models/"
# HTTP headers that are no gRPC metadata, or that gRPC reserves.
_NOT_METADATA = frozenset({"content-type", "content-length", "host", "connection", "te",
                           "transfer-encoding", "keep-alive", "upgrade", "user-agent"})  # fmt: skip
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


@dataclass(frozen=True, slots=True)
class GrpcRequest:
    """One inference request for ModelStreamInfer: tensors (name, datatype, one value) and
    request parameters; `streaming` is generate_stream (SSE) rather than generate."""

    model: str
    request_id: str
    tensors: tuple[tuple[str, str, str | bool], ...]
    parameters: Mapping[str, bool | int | float | str]
    streaming: bool


def grpc_request(
    path: str, body: bytes, declared: Mapping[str, frozenset[str]] | None = None
) -> GrpcRequest:
    """The inference request for a generate request (`path`, JSON `body`) that the adapter
    built. `declared`: each model's inputs, where known; a return_* flag its model lacks is
    left out (Triton rejects an undeclared input)."""
    rest = path.removeprefix(_MODEL_PREFIX)
    quoted, _, kind = rest.partition("/")
    if not quoted or kind not in ("generate", "generate_stream"):
        raise ValueError(f"not a generate path: {path!r}")
    name = unquote(quoted)
    known = declared.get(name) if declared else None
    obj = json.loads(body)
    tensors: list[tuple[str, str, str | bool]] = []
    parameters: dict[str, bool | int | float | str] = {}
    request_id = ""

    def place(key: str, value: Any) -> None:
        datatype = INPUT_TYPES.get(key)
        if datatype is None:
            if not isinstance(value, bool | int | float | str):
                raise ValueError(f"parameter {key!r} is not a scalar")
            parameters[key] = value
        elif known is None or key in known or key in REQUIRED_INPUTS:
            tensors.append((key, datatype, value))

    for key, value in obj.items():
        if key == "id":
            request_id = str(value)
        elif key == "parameters":
            for k, v in value.items():
                place(k, v)
        else:
            place(key, value)
    return GrpcRequest(name, request_id, tuple(tensors), parameters, kind == "generate_stream")


def grpc_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers gRPC can carry as metadata (tracing, request ids, credentials): a
    header it cannot (a reserved or binary key, a character outside ASCII) is left out."""
    out = {}
    for key, value in headers.items():
        k = key.lower()
        if (
            k in _NOT_METADATA
            or k.startswith("grpc-")
            or k.endswith("-bin")
            or not _KEY_CHARS.issuperset(k)
            or not value.isascii()
        ):
            continue
        out[k] = value
    return out


def _bytes_elements(raw: bytes) -> list[str]:
    """A BYTES tensor's raw contents: each element a 4-byte little-endian length, then it."""
    out, i, end = [], 0, len(raw)
    while i + 4 <= end:
        (n,) = struct.unpack_from("<I", raw, i)
        out.append(raw[i + 4 : i + 4 + n].decode("utf-8", "replace"))
        i += 4 + n
    return out


def _raw_elements(datatype: str, raw: bytes) -> list[Any]:
    if datatype == "BYTES":
        return _bytes_elements(raw)
    if datatype == "BOOL":
        return [b != 0 for b in raw]
    fmt = _NUMERIC.get(datatype)
    if fmt is None:
        return []
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw))


def _raw_value(datatype: str, raw: bytes) -> Any:
    # The usual outputs first (one string, one count): every stream response decodes them.
    if datatype == "BYTES":
        if len(raw) >= 4 and int.from_bytes(raw[:4], "little") == len(raw) - 4:
            return raw[4:].decode("utf-8", "replace")
    elif datatype == "UINT32" and len(raw) == 4:
        return int.from_bytes(raw, "little")
    values = _raw_elements(datatype, raw)
    return values[0] if len(values) == 1 else values


def decode_outputs(response: Any) -> dict[str, Any]:
    """A ModelInferResponse's outputs by name, one element as a scalar and several as a list,
    as Triton's HTTP generate writes them."""
    out: dict[str, Any] = {}
    raw = response.raw_output_contents
    for i, tensor in enumerate(response.outputs):
        if i < len(raw):
            out[tensor.name] = _raw_value(tensor.datatype, raw[i])
            continue
        # Typed contents instead of raw bytes.
        field = _CONTENTS.get(tensor.datatype)
        values = list(getattr(tensor.contents, field)) if field else []
        if tensor.datatype == "BYTES":
            values = [v.decode("utf-8", "replace") for v in values]
        out[tensor.name] = values[0] if len(values) == 1 else values
    return out


def response_body(response: Any, streaming: bool) -> tuple[bytes, bool]:
    """One stream response as Triton's HTTP generate API would send it, and whether it is the
    request's last: Triton's `triton_final_response` parameter says so; a server that does not
    send it ends a non-streamed request with its one response and a stream with the finish."""
    obj: dict[str, Any] = {"model_name": response.model_name,
                           "model_version": response.model_version}  # fmt: skip
    if response.id:
        obj["id"] = response.id
    obj.update(decode_outputs(response))
    params = response.parameters
    if "triton_final_response" in params:
        final = bool(params["triton_final_response"].bool_param)
    else:
        finish = obj.get("finish_reason")
        final = not streaming or (finish is not None and finish != "None")
    text = json.dumps(obj, separators=(",", ":"))
    return (f"data: {text}\n\n" if streaming else text).encode(), final


def error_body(message: str, streaming: bool) -> bytes:
    """Triton's error body: `{"error": ...}`, SSE-framed on generate_stream."""
    text = json.dumps({"error": message}, separators=(",", ":"))
    return (f"data: {text}\n\n" if streaming else text).encode()


def status_of_code(code: str) -> int:
    """The HTTP status for a failed call's grpc.StatusCode name."""
    return _CODES.get(code, 500)


def status_of_message(message: str) -> int:
    """The HTTP status for a stream response's error: 400 for Triton's own checks of the
    request, 500 for the backend's failures."""
    return 400 if message.startswith(_CORE_CHECKS) else 500


def input_problems(inputs: Mapping[str, str]) -> list[str]:
    """What makes a model's inputs (name -> datatype, from its metadata) unlike the vLLM
    backend's: a required input missing, or an input the gateway sends of another type."""
    problems = [f"no input {n!r}" for n in REQUIRED_INPUTS if n not in inputs]
    problems += [
        f"input {n!r} is {inputs[n]}, not {t}"
        for n, t in INPUT_TYPES.items()
        if n in inputs and inputs[n] != t
    ]
    return problems
