"""vLLM's OpenAI-compatible server: bodies go upstream unchanged (vLLM's extra fields
included) and replies come back unchanged, JSON in one piece and SSE chunk by chunk as the
engine flushes it, never re-serialised. The relay only peeks at the bytes for telemetry."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.core.api import REASONING_FIELDS
from gateway.core.errors import error_json, sse_error
from gateway.core.exchange import body_of
from gateway.core.sse import skip_space
from gateway.wire import Incompatible
from gateway.wire.metrics import EngineStats
from gateway.wire.vllm.metrics import METRICS_QUERY, parse_vllm_metrics

if TYPE_CHECKING:
    from gateway.core.exchange import Exchange

__all__ = ["ADAPTER", "VllmAdapter", "VllmRelay", "completion_tokens", "has_text"]

DONE = b"data: [DONE]\n\n"
_ERROR_EVENT = b'data: {"error"'
# Where generated tokens stream: a completion's `text`; a chat delta's `content`, its reasoning
# (`reasoning` as vLLM's reasoning parsers send it, `reasoning_content` as older vLLM and
# DeepSeek's API do) and its tool calls' `arguments`. A reasoning model streams its reasoning
# first: its first token is the stream's first, and a TPOT over the tokens usage counts must
# span them (timed from the first `content` instead, TTFT took in the whole reasoning and TPOT
# came out a fraction of the truth).
_TEXT_KEYS = (b'"text"', b'"content"')
_CHAT_KEYS = (b'"content"', *(b'"%s"' % f.encode() for f in REASONING_FIELDS), b'"arguments"',
              b'"text"')  # fmt: skip
_USAGE_KEY = b'"completion_tokens":'


def has_text(chunk: bytes, keys: tuple[bytes, ...] = _CHAT_KEYS) -> bool:
    """Whether an SSE chunk carries generated text (a non-empty string under one of `keys`,
    looked for in that order: by default any of a completion's or a chat's)."""
    for key in keys:
        i = chunk.find(key)
        while i != -1:
            if _string_follows(chunk, i + len(key)):
                return True
            i = chunk.find(key, i + 1)
    return False


def _string_follows(chunk: bytes, j: int) -> bool:
    """Whether a key ending at `j` has a non-empty string for its value: `:"` then anything
    but `"`, with JSON's whitespace allowed around the colon (an engine writing its JSON with
    Python's `json.dumps` defaults sends `"text": "..."`)."""
    if chunk[j : j + 2] == b':"':  # compact, as vLLM writes it
        return chunk[j + 2 : j + 3] != b'"'
    j = skip_space(chunk, j)
    if chunk[j : j + 1] != b":":
        return False
    j = skip_space(chunk, j + 1)
    return chunk[j : j + 1] == b'"' and chunk[j + 1 : j + 2] != b'"'


def completion_tokens(chunk: bytes) -> int | None:
    """The last `completion_tokens` of a usage object in `chunk`."""
    i = chunk.rfind(_USAGE_KEY)
    if i == -1:
        return None
    j = end = i + len(_USAGE_KEY)
    while end < len(chunk) and chunk[end : end + 1] in b" 0123456789":
        end += 1
    try:
        return int(chunk[j:end])
    except ValueError:
        return None


class VllmRelay:
    __slots__ = ("_keys", "carried_usage", "completion_tokens", "engine_error", "text_events")

    def __init__(self, chat: bool = False) -> None:
        self.text_events = 0
        self.completion_tokens: int | None = None
        self.engine_error = False
        self.carried_usage = False
        self._keys = _CHAT_KEYS if chat else _TEXT_KEYS

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        # `find`, not `in`, on this path (every read of a stream): CPython 3.11's `sub in bytes`
        # first tries `sub` as an integer, raising and clearing a TypeError each time, which
        # callgrind counts as ~1,800 instructions of each test. Each search reads the whole
        # read (bytes searches were 10% of a relayed stream's instructions): as few as will do.
        text = has_text(chunk, self._keys)
        events = chunk.count(b"data: ") if text else 0
        self.text_events += events
        # vLLM's own mid-stream error event, relayed as is; it can share a read with text. An
        # event begins with its `data: `: a read of one text event holds no other event.
        if chunk.startswith(_ERROR_EVENT) or (events != 1 and chunk.find(_ERROR_EVENT, 1) != -1):
            self.engine_error = True
        self.carried_usage = chunk.find(b'"usage"') != -1
        if self.carried_usage and (n := completion_tokens(chunk)) is not None:
            self.completion_tokens = n
        return chunk, text

    def close(self) -> bytes:
        return b""  # vLLM ends its streams itself, [DONE] included

    def fail(self, message: str, status: int = 502) -> bytes:
        return sse_error(message, status) + DONE


class VllmAdapter:
    kind = "vllm"
    label = "vLLM"
    health_path = "/health"
    # vLLM's page is prometheus_client's, which takes `name[]` (as of vLLM's ASGI metrics app;
    # a version that sends the whole page anyway is read the same): some 20 lines, not 400
    # (docs/results/metrics-query).
    metrics_query = METRICS_QUERY
    restricts = False
    passthrough = True
    ambiguous: frozenset[int] = frozenset()  # vLLM answers the client's mistakes with 4xx

    def parse_metrics(self, text: str) -> Mapping[str, EngineStats]:
        return parse_vllm_metrics(text)

    def incompatibility(self, ex: Exchange) -> Incompatible | None:
        return None

    def request(self, ex: Exchange, options: Any) -> tuple[str, bytes]:
        if options.priority_scheduling and ex.priority and "priority" not in ex.data:
            body = ex.prepared.get("vllm_priority")
            if not isinstance(body, bytes):
                body = ex.prepared["vllm_priority"] = body_of({**ex.data, "priority": ex.priority})
            return ex.endpoint.path, body
        return ex.endpoint.path, ex.body

    def reply(
        self, ex: Exchange, status: int, body: bytes, content_type: bytes
    ) -> tuple[int, bytes, bytes]:
        return status, body, content_type

    def refused(self, status: int, body: bytes) -> bytes:
        return body

    def early_error(self, first: bytes) -> tuple[int, bytes] | None:
        if not first.startswith(_ERROR_EVENT):
            return None
        end = first.find(b"\n\n")
        payload = first[len(b"data: ") : end if end != -1 else None]
        try:
            code = int(json.loads(payload)["error"].get("code") or 500)
        except (ValueError, KeyError, TypeError, AttributeError):
            return 500, error_json(500, "The engine failed before answering.")
        return code, payload

    def relay(self, ex: Exchange) -> VllmRelay:
        return VllmRelay(ex.endpoint.chat)


ADAPTER = VllmAdapter()
