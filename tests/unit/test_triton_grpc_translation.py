"""Triton's generate API <-> its gRPC stream (gateway.wire.triton.grpc_codec), and the stand-in's
reading of inference requests (engines.sim.triton_grpc): pure, tables of cases."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from tritonclient.grpc import service_pb2

from engines.sim.triton import TritonError
from engines.sim.triton_grpc import infer_response, read_request
from gateway.wire.triton import grpc_codec as g
from gateway.wire.triton.adapter import generate_request

PATH = "/v2/models/llama31-8b-awq/generate_stream"
ALL = frozenset(g.INPUT_TYPES)


def _bytes(*items: str) -> bytes:
    return b"".join(struct.pack("<I", len(b := s.encode())) + b for s in items)


@pytest.mark.parametrize(
    ("data", "stream", "tensors", "parameters"),
    [
        ({"prompt": "hi", "max_tokens": 4}, True,
         {"text_input": "hi", "stream": True, "exclude_input_in_output": True,
          "return_finish_reason": True, "return_num_input_tokens": True,
          "return_num_output_tokens": True},
         {"max_tokens": 4}),
        # Lists travel in sampling_parameters, as over HTTP.
        ({"prompt": "hi", "stop": ["a", "b"], "temperature": 0.5}, False,
         {"text_input": "hi", "stream": False, "exclude_input_in_output": True,
          "sampling_parameters": '{"temperature":0.5,"stop":["a","b"]}',
          "return_finish_reason": True, "return_num_input_tokens": True,
          "return_num_output_tokens": True},
         {}),
    ],
)  # fmt: skip
def test_the_generate_request_maps_as_tritons_http_front_maps_it(
    data: dict[str, Any], stream: bool, tensors: dict[str, Any], parameters: dict[str, Any]
) -> None:
    body = generate_request(data, stream=stream, request_id="r1")
    path = PATH if stream else PATH.removesuffix("_stream")
    req = g.grpc_request(path, body)
    assert (req.model, req.request_id, req.streaming) == ("llama31-8b-awq", "r1", stream)
    assert {n: v for n, _, v in req.tensors} == tensors
    assert all(t == g.INPUT_TYPES[n] for n, t, _ in req.tensors)
    assert dict(req.parameters) == parameters


@pytest.mark.parametrize(
    ("declared", "left_out"),
    [
        (None, set()),
        ({"llama31-8b-awq": ALL}, set()),
        # An older backend without the return_* inputs: the flags are not sent (Triton would
        # refuse an undeclared input); the required inputs always are.
        ({"llama31-8b-awq": frozenset(g.REQUIRED_INPUTS)},
         {"return_finish_reason", "return_num_input_tokens", "return_num_output_tokens"}),
        ({"other": frozenset()}, set()),  # another model's inputs say nothing of this one
    ],
)  # fmt: skip
def test_optional_inputs_the_model_lacks_are_left_out(
    declared: dict[str, frozenset[str]] | None, left_out: set[str]
) -> None:
    body = generate_request({"prompt": "x"}, stream=True, request_id="r")
    sent = {n for n, _, _ in g.grpc_request(PATH, body, declared).tensors}
    every = {n for n, _, _ in g.grpc_request(PATH, body).tensors}
    assert every - sent == left_out


@pytest.mark.parametrize(
    "path", ["/v2/models/m/infer", "/v2/models//generate", "/v1/completions", "/v2/models/m"]
)
def test_only_generate_paths(path: str) -> None:
    with pytest.raises(ValueError, match="not a generate path"):
        g.grpc_request(path, b"{}")


def test_a_quoted_model_name_is_unquoted() -> None:
    assert g.grpc_request("/v2/models/a%20b/generate", b'{"text_input":"x"}').model == "a b"


def _response(final: bool | None, **outputs: tuple[str, bytes]) -> Any:
    r = service_pb2.ModelInferResponse(model_name="m", model_version="1", id="r1")
    for name, (datatype, raw) in outputs.items():
        r.outputs.add(name=name, datatype=datatype, shape=[1])
        r.raw_output_contents.append(raw)
    if final is not None:
        r.parameters["triton_final_response"].bool_param = final
    return r


@pytest.mark.parametrize(
    ("response", "streaming", "body", "final"),
    [
        (_response(False, text_output=("BYTES", _bytes(" a")),
                   finish_reason=("BYTES", _bytes("None")),
                   num_output_tokens=("UINT32", struct.pack("<I", 1))),
         True,
         b'data: {"model_name":"m","model_version":"1","id":"r1","text_output":" a",'
         b'"finish_reason":"None","num_output_tokens":1}\n\n', False),
        (_response(True, text_output=("BYTES", _bytes(" b")),
                   finish_reason=("BYTES", _bytes("length"))),
         True, None, True),
        # No triton_final_response: a non-streamed request ends with its one response, a
        # stream with the finish reason.
        (_response(None, text_output=("BYTES", _bytes("x y"))), False,
         b'{"model_name":"m","model_version":"1","id":"r1","text_output":"x y"}', True),
        (_response(None, finish_reason=("BYTES", _bytes("None"))), True, None, False),
        (_response(None, finish_reason=("BYTES", _bytes("stop"))), True, None, True),
        # Several elements are a list; numbers of other types decode too.
        (_response(True, text_output=("BYTES", _bytes("a", "b")),
                   cumulative_logprob=("FP32", struct.pack("<f", 0.5)),
                   flags=("BOOL", b"\x01\x00")),
         False,
         b'{"model_name":"m","model_version":"1","id":"r1","text_output":["a","b"],'
         b'"cumulative_logprob":0.5,"flags":[true,false]}', True),
    ],
)  # fmt: skip
def test_responses_read_as_the_http_generate_api(
    response: Any, streaming: bool, body: bytes | None, final: bool
) -> None:
    got, is_final = g.response_body(response, streaming)
    assert is_final is final
    if body is not None:
        assert got == body
    assert got.startswith(b"data: ") is streaming


def test_typed_contents_decode_like_raw_ones() -> None:
    r = service_pb2.ModelInferResponse(model_name="m")
    t = r.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(b"hi")
    n = r.outputs.add(name="num_output_tokens", datatype="UINT32", shape=[1])
    n.contents.uint_contents.append(3)
    assert g.decode_outputs(r) == {"text_output": "hi", "num_output_tokens": 3}


@pytest.mark.parametrize(
    ("code", "status"),
    [("INVALID_ARGUMENT", 400), ("NOT_FOUND", 404), ("UNAVAILABLE", 503),
     ("RESOURCE_EXHAUSTED", 429), ("UNAUTHENTICATED", 401), ("PERMISSION_DENIED", 403),
     ("INTERNAL", 500), ("UNIMPLEMENTED", 501), ("DEADLINE_EXCEEDED", 504),
     ("SOMETHING_NEW", 500)],
)  # fmt: skip
def test_call_status_codes(code: str, status: int) -> None:
    assert g.status_of_code(code) == status


@pytest.mark.parametrize(
    ("message", "status"),
    [("Request for unknown model: 'x' is not found", 400),
     ("[request id: r1] unexpected inference input 'foo' for model 'm'", 400),
     ("Error generating stream: top_p must be in (0, 1]", 500),
     ("Request was cancelled", 500)],
)  # fmt: skip
def test_stream_error_statuses(message: str, status: int) -> None:
    assert g.status_of_message(message) == status


@pytest.mark.parametrize(
    ("headers", "metadata"),
    [
        ({"content-type": "application/json", "X-Request-Id": "r1", "traceparent": "00-a-b-01",
          "authorization": "Bearer k"},
         {"x-request-id": "r1", "traceparent": "00-a-b-01", "authorization": "Bearer k"}),
        ({"grpc-timeout": "1S", "trace-bin": "x", "a b": "c", "x-name": "caf\u00e9", "te": "x"},
         {}),
    ],
)  # fmt: skip
def test_grpc_metadata(headers: dict[str, str], metadata: dict[str, str]) -> None:
    assert g.grpc_metadata(headers) == metadata


def test_error_bodies() -> None:
    assert g.error_body("no", False) == b'{"error":"no"}'
    assert g.error_body("no", True) == b'data: {"error":"no"}\n\n'


@pytest.mark.parametrize(
    ("inputs", "problems"),
    [
        ({n: t for n, t in g.INPUT_TYPES.items()}, []),
        ({"text_input": "BYTES", "stream": "BOOL", "sampling_parameters": "BYTES",
          "exclude_input_in_output": "BOOL"}, []),
        ({"INPUT_0": "BYTES"}, ["no input 'text_input'", "no input 'stream'",
                                "no input 'sampling_parameters'",
                                "no input 'exclude_input_in_output'"]),
        ({**g.INPUT_TYPES, "stream": "BYTES"}, ["input 'stream' is BYTES, not BOOL"]),
    ],
)  # fmt: skip
def test_input_problems(inputs: dict[str, str], problems: list[str]) -> None:
    assert g.input_problems(inputs) == problems


# -- the stand-in's side ------------------------------------------------------------------------


def _request(**inputs: tuple[str, bytes]) -> Any:
    r = service_pb2.ModelInferRequest(model_name="m", id="r1")
    for name, (datatype, raw) in inputs.items():
        r.inputs.add(name=name, datatype=datatype, shape=[1])
        r.raw_input_contents.append(raw)
    return r


def test_the_stand_in_reads_what_the_gateway_sends() -> None:
    body = generate_request({"prompt": "hi", "max_tokens": 3, "stop": ["a", "b"]}, stream=True,
                            request_id="r1")  # fmt: skip
    req = g.grpc_request("/v2/models/m/generate_stream", body)
    pb = service_pb2.ModelInferRequest(model_name=req.model, id=req.request_id)
    for name, datatype, value in req.tensors:
        pb.inputs.add(name=name, datatype=datatype, shape=[1])
        raw = _bytes(str(value)) if datatype == "BYTES" else bytes([bool(value)])
        pb.raw_input_contents.append(raw)
    gen = read_request(pb, "m")
    assert (gen.text, gen.stream, gen.prepend, gen.request_id) == ("hi", True, False, "r1")
    assert gen.sampling == {"max_tokens": 3, "stop": ["a", "b"]}
    assert gen.outputs == {"finish_reason", "num_input_tokens", "num_output_tokens"}


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (service_pb2.ModelInferRequest(model_name="other"), "Request for unknown model"),
        (_request(text_input=("BYTES", _bytes("x")), foo=("BOOL", b"\x01")),
         "unexpected inference input 'foo'"),
        (_request(text_input=("BYTES", _bytes("x")), stream=("BYTES", _bytes("true"))),
         "data-type is 'BYTES', but model 'm' expects 'BOOL'"),
        (_request(stream=("BOOL", b"\x01")), "missing required input(s) ['text_input']"),
    ],
)  # fmt: skip
def test_the_stand_in_refuses_what_triton_refuses(request_: Any, message: str) -> None:
    with pytest.raises(TritonError) as e:
        read_request(request_, "m")
    assert e.value.status == 400
    assert message in e.value.message


def test_the_stand_ins_responses_read_back() -> None:
    reply = {"model_name": "m", "model_version": "1", "id": "r1", "text_output": " a b",
             "finish_reason": "length", "num_output_tokens": 2}  # fmt: skip
    body, final = g.response_body(infer_response(reply, True).infer_response, False)
    assert final
    assert json.loads(body) == reply
