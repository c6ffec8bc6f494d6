"""OpenAI `/v1/completions` <-> Triton's generate extension in front of the vLLM backend.

The translation is pure, no I/O: gateway/pipeline/upstream.py sends and relays, `TritonAdapter` says
what the bytes are.

What Triton and its vLLM backend do with a generate request (server http_server.cc and
vllm_backend src/model.py, src/utils/request.py):
- every key of `parameters` that names a model input (`stream`, `exclude_input_in_output`,
  `return_num_output_tokens`, ...) becomes an input tensor; every other key becomes a request
  parameter, and the backend builds vLLM's `SamplingParams(**parameters)` from those. A request
  parameter must be a string, number or bool (a list is a 400), so lists (several stop strings,
  `stop_token_ids`) travel in the `sampling_parameters` input instead, as a JSON string, which
  the backend prefers when present. An unknown key would break `SamplingParams`, so only the
  sampling fields vLLM knows are sent;
- without `exclude_input_in_output: true` a non-streamed reply starts with the prompt;
- `/generate` answers one JSON object; `/generate_stream` answers SSE `data:` events, one per
  engine step, and no `[DONE]`. With `return_num_output_tokens` each event carries the tokens it
  added; `finish_reason` is the string "None" until the last event;
- errors are `{"error": "<message>"}`. The HTTP status is taken from the first response, so an
  error after the first event arrives as a `data: {"error": ...}` event of a 200 stream, and a
  failed first response of a stream is SSE-framed too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gateway.core.errors import error_body, error_json, sse_error
from gateway.wire import Incompatible
from gateway.wire.metrics import EngineStats
from gateway.wire.triton.metrics import parse_triton_metrics

if TYPE_CHECKING:
    from gateway.core.exchange import Exchange

__all__ = [
    "ADAPTER",
    "Call",
    "Incompatible",
    "StreamTranslator",
    "TritonAdapter",
    "error_reply",
    "generate_request",
    "incompatibility",
    "prepare",
]

# OpenAI/vLLM completion fields that are vLLM SamplingParams fields of a scalar type.
SCALAR_SAMPLING: tuple[str, ...] = (
    "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
)  # fmt: skip
_INT_FIELDS = frozenset({"max_tokens", "min_tokens", "top_k", "seed"})
_BOOL_FIELDS = frozenset({
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output",
})  # fmt: skip
# Fields whose meaning the generate API cannot carry: a request using them is not sent to Triton.
_UNSUPPORTED: tuple[tuple[str, str], ...] = (
    ("echo", "echo"),
    ("logprobs", "logprobs"),
    ("prompt_logprobs", "prompt logprobs"),
    ("suffix", "a suffix"),
    ("logit_bias", "logit_bias"),
    ("response_format", "response_format"),
    ("structured_outputs", "structured outputs"),
    ("guided_json", "guided decoding"),
    ("guided_regex", "guided decoding"),
    ("guided_choice", "guided decoding"),
    ("guided_grammar", "guided decoding"),
)
# Inputs the vLLM backend declares: under `parameters` they become tensors, not sampling fields.
_OUTPUT_FLAGS: Mapping[str, bool] = MappingProxyType({
    "return_finish_reason": True,
    "return_num_input_tokens": True,
    "return_num_output_tokens": True,
})  # fmt: skip
# Triton status -> what the client gets. A 400 is the request's fault and stays one (but see
# error_reply); 404, 501 and the rest mean the gateway's configuration does not match the server
# (a wrong path, no generate extension): the client did nothing wrong, so a bad gateway.
_ERRORS: Mapping[int, tuple[int, str]] = MappingProxyType({
    400: (400, "BadRequestError"),
    429: (429, "RateLimitError"),
    500: (500, "InternalServerError"),
    502: (502, "BadGatewayError"),
    503: (503, "ServiceUnavailableError"),
    504: (504, "GatewayTimeoutError"),
})  # fmt: skip
_BAD_GATEWAY = (502, "BadGatewayError")


def _unset(value: Any) -> bool:
    # Not `in (None, False, ...)`: that would take logprobs=0 (a real request) for False.
    return value is None or value is False or (isinstance(value, str | dict | list) and not value)


def _typed(key: str, value: Any) -> bool:
    if key in _BOOL_FIELDS:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if key in _INT_FIELDS else isinstance(value, int | float)


def incompatibility(data: Mapping[str, Any]) -> Incompatible | None:
    """None when `data` (a validated completions body) can be served by Triton's generate API."""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return Incompatible("prompt", "Triton backends take one text prompt (no token ids, no "
                            "batch of prompts)")  # fmt: skip
    for key in ("n", "best_of"):
        if data.get(key) not in (None, 1):
            return Incompatible(key, f"Triton backends return one choice ({key} must be 1)")
    for key, what in _UNSUPPORTED:
        if not _unset(data.get(key)):
            return Incompatible(key, f"Triton's generate API cannot return {what}")
    for key in SCALAR_SAMPLING:
        value = data.get(key)
        if value is not None and not _typed(key, value):
            # vLLM would answer 400; the backend would fail with a 500 instead.
            return Incompatible(key, f"{key} has the wrong type")
    stop = data.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        return Incompatible("stop", "stop must be a string or a list of strings")
    ids = data.get("stop_token_ids")
    if ids is not None and not (
        isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        return Incompatible("stop_token_ids", "stop_token_ids must be a list of integers")
    return None


def _prompt(data: Mapping[str, Any]) -> str:
    prompt = data["prompt"]
    return prompt if isinstance(prompt, str) else str(prompt[0])


def generate_request(data: Mapping[str, Any], *, stream: bool, request_id: str = "") -> bytes:
    """The generate request for a completions body that `incompatibility` accepted."""
    sampling: dict[str, Any] = {k: data[k] for k in SCALAR_SAMPLING if data.get(k) is not None}
    stop = data.get("stop")
    if isinstance(stop, list):
        stop = stop[0] if len(stop) == 1 else stop or None
    if stop:
        sampling["stop"] = stop
    if data.get("stop_token_ids"):
        sampling["stop_token_ids"] = data["stop_token_ids"]
    parameters: dict[str, Any] = {
        "stream": stream,
        "exclude_input_in_output": True,
        **_OUTPUT_FLAGS,
    }
    out: dict[str, Any] = {"text_input": _prompt(data)}
    if request_id:
        out["id"] = request_id
    if any(isinstance(v, list) for v in sampling.values()):
        # Request parameters are scalars only: lists need the sampling_parameters input.
        out["sampling_parameters"] = json.dumps(sampling, separators=(",", ":"))
    else:
        parameters.update(sampling)
    out["parameters"] = parameters
    return json.dumps(out, separators=(",", ":")).encode()


def _message(body: bytes) -> str | None:
    """The message of a Triton error body (`{"error": "..."}`, SSE-framed or not)."""
    text = body.strip()
    if text.startswith(b"data:"):
        text = text[5:].strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(obj, dict) and "error" in obj:
        return str(obj["error"])
    return None


def error_reply(status: int, body: bytes) -> tuple[int, bytes]:
    """A Triton error answer as the OpenAI error the client gets (status, JSON body)."""
    code, kind = _ERRORS.get(status, _BAD_GATEWAY)
    message = _message(body)
    if message is None:
        message = f"Triton answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
    elif message.startswith("Request for unknown model"):
        # Triton's 400 for a model it does not have: the gateway's model mapping is wrong.
        code, kind = _BAD_GATEWAY
    return code, error_json(code, message, kind=kind)


def _finish(value: Any) -> str | None:
    # The backend sends str(None) until the sequence finishes.
    if value is None or value == "None":
        return None
    return str(value)


def _text(value: Any) -> str:
    if isinstance(value, list):  # one element per choice; there is one choice
        return str(value[0]) if value else ""
    return "" if value is None else str(value)


def _count(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Call:
    """One completions request, translated once for whichever Triton backend serves it."""

    body: bytes
    stream: bool
    id: str
    created: int
    model: str
    max_tokens: int | None
    include_usage: bool
    continuous_usage: bool

    def path(self, triton_model: str) -> str:
        kind = "generate_stream" if self.stream else "generate"
        return f"/v2/models/{quote(triton_model, safe='')}/{kind}"

    def usage(self, prompt: int | None, completion: int | None) -> dict[str, int] | None:
        if prompt is None or completion is None:
            return None
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}  # fmt: skip

    def inferred_finish(self, completion: int | None) -> str:
        """For backends that do not report it: "length" when max_tokens was used up."""
        limit = 16 if self.max_tokens is None else self.max_tokens  # vLLM's default
        return "length" if completion is not None and completion >= limit else "stop"

    def chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": [{"index": 0, "text": text, "logprobs": None,
                "finish_reason": finish, "stop_reason": None}]}  # fmt: skip

    def reply(self, status: int, body: bytes) -> tuple[int, bytes]:
        """Triton's answer to /generate (or a stream that failed at once) as OpenAI's."""
        if status != 200:
            return error_reply(status, body)
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict) or "error" in obj:
            # A 200 can still carry an error (Triton set the status before it failed).
            message = _message(body) or "Triton sent a reply that is not a generate response"
            return 502, error_json(502, message)
        completion = _count(obj.get("num_output_tokens"))
        finish = _finish(obj.get("finish_reason")) or self.inferred_finish(completion)
        out = self.chunk(_text(obj.get("text_output")), finish)
        usage = self.usage(_count(obj.get("num_input_tokens")), completion)
        if usage is not None:
            out["usage"] = usage
        return 200, json.dumps(out).encode()

    def stream_translator(self) -> StreamTranslator:
        return StreamTranslator(self)


def prepare(
    data: Mapping[str, Any], *, model: str, stream: bool, request_id: str, created: int
) -> Call:
    """Translate a compatible completions body once; `model` is the name the client asked for."""
    opts = data.get("stream_options") or {}
    max_tokens = data.get("max_tokens")
    return Call(
        body=generate_request(data, stream=stream, request_id=request_id),
        stream=stream,
        id=f"cmpl-{request_id}",
        created=created,
        model=model,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        include_usage=stream and bool(opts.get("include_usage")),
        continuous_usage=stream and bool(opts.get("continuous_usage_stats")),
    )


def _sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


# The end of `_sse(call.chunk("", None))`, from the text on: what sse_chunk rebuilds per event.
_CHUNK_TAIL = b'"","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'


DONE = b"data: [DONE]\n\n"


class StreamTranslator:
    """Triton `generate_stream` events in, OpenAI completion chunks out, fed as bytes arrive
    (an event may be split over reads, or several may come in one)."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.buffer = b""
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.text_events = 0
        self.finished = False
        self.error: str | None = None
        # Every event's chunk is this request's same JSON around a new text and finish reason:
        # built once here, so an event costs two small json.dumps instead of a whole chunk's.
        self.prefix = _sse(call.chunk("", None))[: -len(_CHUNK_TAIL)]

    def feed(self, chunk: bytes) -> bytes:
        """OpenAI SSE bytes for the complete events in `chunk` (and what was buffered)."""
        self.buffer += chunk
        out: list[bytes] = []
        while (end := self.buffer.find(b"\n\n")) != -1:
            event, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            if self.error is None:
                out.append(self._event(event))
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        # `find`, not `in`: see gateway.wire.vllm.adapter.VllmRelay.feed (every event).
        if event.startswith(b"data:") and event.find(b"\n") == -1:
            data = event[5:]  # the usual event: one data line
        else:
            data = b"".join(
                line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")
            )
        if not data:
            return b""  # a comment or keep-alive
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict):
            return self._fail("Triton sent an event that is not JSON")
        if "error" in obj:
            return self._fail(str(obj["error"]))
        if (n := _count(obj.get("num_input_tokens"))) is not None:
            self.prompt_tokens = n
        if (n := _count(obj.get("num_output_tokens"))) is not None:
            self.completion_tokens = (self.completion_tokens or 0) + n
        text, finish = _text(obj.get("text_output")), _finish(obj.get("finish_reason"))
        if not text and finish is None:
            return b""
        self.finished = self.finished or finish is not None
        if text:
            self.text_events += 1
        return self._chunk(text, finish)

    def _chunk(self, text: str, finish: str | None) -> bytes:
        if self.call.continuous_usage and (
            usage := self.call.usage(self.prompt_tokens, self.completion_tokens)
        ):
            return _sse({**self.call.chunk(text, finish), "usage": usage})
        return b"".join((self.prefix, json.dumps(text).encode(), b',"logprobs":null,'
                         b'"finish_reason":', json.dumps(finish).encode(),
                         b',"stop_reason":null}]}\n\n'))  # fmt: skip

    def _fail(self, message: str) -> bytes:
        self.error = message
        return _sse(error_body(500, message))

    def fail(self, message: str, status: int = 502) -> bytes:
        """The end of a stream cut short: an error event (vLLM's shape), [DONE]."""
        return (b"" if self.error else sse_error(message, status)) + DONE

    def close(self) -> bytes:
        """The end of a stream that Triton closed: the finish reason if it never came, usage
        when asked for, then [DONE]."""
        out = [self.feed(b"\n\n")] if self.buffer.strip() else []
        if self.error is None:
            if not self.finished:
                out.append(self._chunk("", self.call.inferred_finish(self.completion_tokens)))
            usage = self.call.usage(self.prompt_tokens, self.completion_tokens)
            if self.call.include_usage and usage is not None:
                out.append(_sse({**self.call.chunk("", None), "choices": [], "usage": usage}))
        out.append(DONE)
        return b"".join(out)


class _Relay:
    """A Triton stream as the gateway's StreamRelay."""

    __slots__ = ("tr",)

    def __init__(self, tr: StreamTranslator) -> None:
        self.tr = tr

    @property
    def text_events(self) -> int:
        return self.tr.text_events

    @property
    def completion_tokens(self) -> int | None:
        return self.tr.completion_tokens

    @property
    def engine_error(self) -> bool:
        return self.tr.error is not None

    @property
    def carried_usage(self) -> bool:
        # The translator writes usage into what it gives out only as continuous usage (the
        # final usage comes with `close`, which goes through every filter).
        return self.tr.call.continuous_usage

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        seen = self.tr.text_events
        out = self.tr.feed(chunk)
        return out, self.tr.text_events != seen

    def close(self) -> bytes:
        return self.tr.close()

    def fail(self, message: str, status: int = 502) -> bytes:
        return self.tr.fail(message, status)


_CHAT = Incompatible(
    None,
    "Chat completions need a chat template, which Triton's generate API does not apply; send"
    " /v1/completions with a formatted prompt",
)


class TritonAdapter:
    kind = "triton"
    label = "Triton"
    # Triton answers 400 here while a model is not ready.
    health_path = "/v2/health/ready"
    metrics_query = ""  # Triton's page takes no query
    restricts = True
    passthrough = False
    ambiguous = frozenset({500})  # "Error generating stream: ..." is often the request's fault

    def parse_metrics(self, text: str) -> Mapping[str, EngineStats]:
        return parse_triton_metrics(text)

    def incompatibility(self, ex: Exchange) -> Incompatible | None:
        return _CHAT if ex.endpoint.chat else incompatibility(ex.data)

    def _call(self, ex: Exchange) -> Call:
        # Translated once per request, whichever Triton backend each attempt goes to.
        call = ex.prepared.get(self.kind)
        if not isinstance(call, Call):
            call = ex.prepared[self.kind] = prepare(
                ex.data, model=ex.model, stream=ex.stream, request_id=ex.id,
                created=int(time.time()),
            )  # fmt: skip
        return call

    def request(self, ex: Exchange, options: Any) -> tuple[str, bytes]:
        call = self._call(ex)
        return call.path(options.triton_models.get(ex.model, ex.model)), call.body

    def reply(
        self, ex: Exchange, status: int, body: bytes, content_type: bytes
    ) -> tuple[int, bytes, bytes]:
        status, body = self._call(ex).reply(status, body)
        return status, body, b"application/json"

    def refused(self, status: int, body: bytes) -> bytes:
        return error_reply(status, body)[1]

    def early_error(self, first: bytes) -> tuple[int, bytes] | None:
        return None  # Triton's errors are 500s, often the request's own (see `ambiguous`)

    def relay(self, ex: Exchange) -> _Relay:
        return _Relay(self._call(ex).stream_translator())


ADAPTER = TritonAdapter()
