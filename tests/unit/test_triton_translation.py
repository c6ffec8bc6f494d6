"""OpenAI completions <-> Triton generate (gateway/wire/triton/adapter.py), by tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.wire.triton.adapter import Call, Incompatible, error_reply, incompatibility, prepare

FLAGS = {"return_finish_reason": True, "return_num_input_tokens": True,
         "return_num_output_tokens": True}  # fmt: skip


def call(streamed: bool = False, **data: Any) -> Call:
    body = {"model": "llama", "prompt": "one two", "stream": streamed, **data}
    return prepare(body, model="llama", stream=streamed, request_id="rid1", created=1700)


# -- requests ---------------------------------------------------------------------------------

REQUESTS: list[tuple[str, dict[str, Any], bool, dict[str, Any]]] = [
    ("minimal", {}, False,
     {"text_input": "one two", "id": "rid1",
      "parameters": {"stream": False, "exclude_input_in_output": True, **FLAGS}}),
    ("stream", {}, True,
     {"text_input": "one two", "id": "rid1",
      "parameters": {"stream": True, "exclude_input_in_output": True, **FLAGS}}),
    ("sampling scalars", {"max_tokens": 8, "temperature": 0, "top_p": 0.9, "seed": 7,
                          "ignore_eos": True, "min_tokens": 2, "top_k": 5}, False,
     {"text_input": "one two", "id": "rid1",
      "parameters": {"stream": False, "exclude_input_in_output": True, **FLAGS, "max_tokens": 8,
                     "temperature": 0, "top_p": 0.9, "seed": 7, "ignore_eos": True,
                     "min_tokens": 2, "top_k": 5}}),
    ("one stop string stays a parameter", {"stop": ["\n"]}, False,
     {"text_input": "one two", "id": "rid1",
      "parameters": {"stream": False, "exclude_input_in_output": True, **FLAGS, "stop": "\n"}}),
    ("several stops need sampling_parameters", {"stop": ["a", "b"], "max_tokens": 4}, False,
     {"text_input": "one two", "id": "rid1",
      "sampling_parameters": json.dumps({"max_tokens": 4, "stop": ["a", "b"]},
                                        separators=(",", ":")),
      "parameters": {"stream": False, "exclude_input_in_output": True, **FLAGS}}),
    ("stop_token_ids need sampling_parameters", {"stop_token_ids": [2]}, False,
     {"text_input": "one two", "id": "rid1",
      "sampling_parameters": '{"stop_token_ids":[2]}',
      "parameters": {"stream": False, "exclude_input_in_output": True, **FLAGS}}),
    ("fields unknown to SamplingParams are dropped",
     {"user": "u", "priority": 3, "request_id": "x", "stream_options": None, "stop": None,
      "n": 1, "echo": False}, False,
     {"text_input": "one two", "id": "rid1",
      "parameters": {"stream": False, "exclude_input_in_output": True, **FLAGS}}),
    ("a one-prompt list is that prompt", {"prompt": ["hello there"]}, False,
     {"text_input": "hello there", "id": "rid1",
      "parameters": {"stream": False, "exclude_input_in_output": True, **FLAGS}}),
]  # fmt: skip


@pytest.mark.parametrize(("data", "stream", "expected"), [r[1:] for r in REQUESTS],
                         ids=[r[0] for r in REQUESTS])  # fmt: skip
def test_request_translation(data: dict[str, Any], stream: bool, expected: dict[str, Any]) -> None:
    c = call(stream, **data)
    assert json.loads(c.body) == expected
    kind = "generate_stream" if stream else "generate"
    assert c.path("llama31-8b-awq") == f"/v2/models/llama31-8b-awq/{kind}"


def test_path_quotes_the_model_name() -> None:
    assert call().path("a b") == "/v2/models/a%20b/generate"


INCOMPATIBLE: list[tuple[dict[str, Any], str | None]] = [
    ({"prompt": "text"}, None),
    ({"prompt": ["text"]}, None),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": [[1, 2]]}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "t", "n": 2}, "n"),
    ({"prompt": "t", "n": 1}, None),
    ({"prompt": "t", "best_of": 3}, "best_of"),
    ({"prompt": "t", "echo": True}, "echo"),
    ({"prompt": "t", "echo": False}, None),
    ({"prompt": "t", "logprobs": 0}, "logprobs"),
    ({"prompt": "t", "logprobs": None}, None),
    ({"prompt": "t", "suffix": "x"}, "suffix"),
    ({"prompt": "t", "logit_bias": {"1": 2}}, "logit_bias"),
    ({"prompt": "t", "guided_json": {"type": "object"}}, "guided_json"),
    ({"prompt": "t", "temperature": "hot"}, "temperature"),
    ({"prompt": "t", "seed": 1.5}, "seed"),
    ({"prompt": "t", "ignore_eos": 1}, "ignore_eos"),
    ({"prompt": "t", "max_tokens": True}, "max_tokens"),
    ({"prompt": "t", "stop": 3}, "stop"),
    ({"prompt": "t", "stop": ["a", 1]}, "stop"),
    ({"prompt": "t", "stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"prompt": "t", "temperature": 0.7, "top_p": 1, "seed": 3, "stop": ["x", "y"]}, None),
]


@pytest.mark.parametrize(("data", "param"), INCOMPATIBLE)
def test_incompatibility(data: dict[str, Any], param: str | None) -> None:
    found = incompatibility(data)
    assert (found.param if found else None) == param
    if found:
        assert isinstance(found, Incompatible)
        assert found.message


# -- non-streamed replies ---------------------------------------------------------------------

OUT = {"model_name": "llama31-8b-awq", "model_version": "1"}
REPLIES: list[tuple[str, dict[str, Any], int, bytes, int, dict[str, Any]]] = [
    ("full outputs", {"max_tokens": 5}, 200,
     json.dumps({**OUT, "text_output": " a b c", "finish_reason": "stop", "num_input_tokens": 2,
                 "num_output_tokens": 3}).encode(),
     200, {"text": " a b c", "finish_reason": "stop",
           "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}),
    ("no counts: no usage; finish inferred from max_tokens", {"max_tokens": 3}, 200,
     json.dumps({**OUT, "text_output": " a b c"}).encode(),
     200, {"text": " a b c", "finish_reason": "stop"}),
    ("counts reach max_tokens: length", {"max_tokens": 3}, 200,
     json.dumps({**OUT, "text_output": " a b c", "num_input_tokens": 2,
                 "num_output_tokens": 3}).encode(),
     200, {"text": " a b c", "finish_reason": "length",
           "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}),
]  # fmt: skip


@pytest.mark.parametrize(("data", "status", "body", "code", "expected"),
                         [r[1:] for r in REPLIES], ids=[r[0] for r in REPLIES])  # fmt: skip
def test_reply(
    data: dict[str, Any], status: int, body: bytes, code: int, expected: dict[str, Any]
) -> None:
    got_status, got = call(**data).reply(status, body)
    assert got_status == code
    out = json.loads(got)
    assert out["id"] == "cmpl-rid1"
    assert (out["object"], out["created"], out["model"]) == ("text_completion", 1700, "llama")
    (choice,) = out["choices"]
    assert choice == {"index": 0, "text": expected["text"], "logprobs": None,
                      "finish_reason": expected["finish_reason"], "stop_reason": None}  # fmt: skip
    assert out.get("usage") == expected.get("usage")


ERRORS: list[tuple[int, bytes, int, str, str]] = [
    (400, b'{"error":"parameter \'x\' has invalid type"}', 400, "BadRequestError",
     "parameter 'x' has invalid type"),
    (500, b'{"error":"Error generating stream: boom"}', 500, "InternalServerError",
     "Error generating stream: boom"),
    (500, b'data: {"error":"Error generating stream: boom"}\n\n', 500, "InternalServerError",
     "Error generating stream: boom"),
    (503, b'{"error":"Model is unavailable due to unhealthy vLLM engine"}', 503,
     "ServiceUnavailableError", "Model is unavailable due to unhealthy vLLM engine"),
    (429, b'{"error":"busy"}', 429, "RateLimitError", "busy"),
    (400, b'{"error":"Request for unknown model: \'m\' is not found"}', 502, "BadGatewayError",
     "Request for unknown model: 'm' is not found"),
    (404, b'{"error":"Not Found"}', 502, "BadGatewayError", "Not Found"),
    (501, b'{"error":"unsupported"}', 502, "BadGatewayError", "unsupported"),
    (502, b"<html>proxy</html>", 502, "BadGatewayError",
     "Triton answered HTTP 502: <html>proxy</html>"),
]  # fmt: skip


@pytest.mark.parametrize(("status", "body", "code", "kind", "message"), ERRORS)
def test_error_reply(status: int, body: bytes, code: int, kind: str, message: str) -> None:
    got_status, got = error_reply(status, body)
    assert got_status == code
    assert json.loads(got) == {"error": {"message": message, "type": kind, "param": None,
                                         "code": code}}  # fmt: skip
    assert call().reply(status, body) == (got_status, got)


def test_a_200_that_carries_an_error_is_a_bad_gateway() -> None:
    body = b'{"error":"generate expects model to produce exactly 1 response"}'
    status, got = call().reply(200, body)
    assert status == 502
    assert json.loads(got)["error"]["message"].startswith("generate expects")
    assert call().reply(200, b"not json")[0] == 502


# -- streams ----------------------------------------------------------------------------------


def events(*objs: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)


def step(text: str, finish: str = "None", n_out: int = 1, n_in: int = 2) -> dict[str, Any]:
    return {**OUT, "text_output": text, "finish_reason": finish, "num_input_tokens": n_in,
            "num_output_tokens": n_out}  # fmt: skip


STREAM = events(step(" a"), step(" b c", n_out=2), step(" d", "length"))


def parse(sse: bytes) -> list[Any]:
    assert sse.endswith(b"data: [DONE]\n\n")
    parts = sse.split(b"\n\n")[:-1]
    assert all(p.startswith(b"data: ") for p in parts)
    return [p[6:].decode() if p == b"data: [DONE]" else json.loads(p[6:]) for p in parts]


@pytest.mark.parametrize("size", [1, 7, 50, len(STREAM)])
def test_stream_translation_whatever_the_chunking(size: int) -> None:
    tr = call(True, max_tokens=4).stream_translator()
    out = b"".join(tr.feed(STREAM[i : i + size]) for i in range(0, len(STREAM), size))
    got = parse(out + tr.close())
    assert [c["choices"][0]["text"] for c in got[:-1]] == [" a", " b c", " d"]
    assert [c["choices"][0]["finish_reason"] for c in got[:-1]] == [None, None, "length"]
    assert all(c["id"] == "cmpl-rid1" and c["object"] == "text_completion" for c in got[:-1])
    assert all("usage" not in c for c in got[:-1])
    assert got[-1] == "[DONE]"
    assert (tr.text_events, tr.prompt_tokens, tr.completion_tokens) == (3, 2, 4)


def test_stream_usage_on_request() -> None:
    tr = call(True, stream_options={"include_usage": True}).stream_translator()
    got = parse(tr.feed(STREAM) + tr.close())
    assert got[-2]["choices"] == []
    assert got[-2]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    continuous = {"include_usage": True, "continuous_usage_stats": True}
    tr = call(True, stream_options=continuous).stream_translator()
    got = parse(tr.feed(STREAM) + tr.close())
    assert [c["usage"]["completion_tokens"] for c in got[:3]] == [1, 3, 4]


def test_stream_without_finish_reason_or_counts_gets_them_inferred() -> None:
    # A backend without the optional outputs: finish inferred, no usage chunk (unknown counts).
    tr = call(True, max_tokens=2, stream_options={"include_usage": True}).stream_translator()
    plain = events({**OUT, "text_output": " a"}, {**OUT, "text_output": " b"})
    got = parse(tr.feed(plain) + tr.close())
    assert [c["choices"][0]["finish_reason"] for c in got[:-1]] == [None, None, "stop"]
    assert got[-2]["choices"][0]["text"] == ""


def test_stream_error_event_becomes_an_openai_error_then_done() -> None:
    tr = call(True).stream_translator()
    bad = events(step(" a"), {"error": "Error generating stream: boom"}, step(" late"))
    got = parse(tr.feed(bad) + tr.close())
    assert got[0]["choices"][0]["text"] == " a"
    err = {"message": "Error generating stream: boom", "type": "InternalServerError",
           "param": None, "code": 500}  # fmt: skip
    assert got[1] == {"error": err}
    assert got[2:] == ["[DONE]"]
    assert tr.error == "Error generating stream: boom"


def test_stream_cut_by_the_transport() -> None:
    tr = call(True).stream_translator()
    got = parse(tr.feed(events(step(" a"))[:-5]) + tr.fail("upstream stream failed: X"))
    assert got == [{"error": {"message": "upstream stream failed: X", "type": "BadGatewayError",
                              "param": None, "code": 502}}, "[DONE]"]  # fmt: skip


def test_stream_skips_empty_steps_and_tolerates_a_missing_last_separator() -> None:
    tr = call(True).stream_translator()
    body = events(step(""), step(" a")) + b"data: " + json.dumps(step(" b", "stop")).encode()
    got = parse(tr.feed(body) + tr.close())
    assert [c["choices"][0]["text"] for c in got[:-1]] == [" a", " b"]
    assert got[-2]["choices"][0]["finish_reason"] == "stop"


def test_stream_garbage_is_an_error() -> None:
    tr = call(True).stream_translator()
    got = parse(tr.feed(b"data: {not json\n\n") + tr.close())
    assert got[0]["error"]["type"] == "InternalServerError"
