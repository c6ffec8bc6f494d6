"""Streams counted in tokens, not events: every stream asks its engine for usage.

A speculative engine (EAGLE) sends a step's several tokens in one SSE event, so a stream's
events undercount its tokens by the tokens per step, and a TPOT read from events overstates
it as much: the latency model then saw an EAGLE engine at 6 ms per token as one at about 14,
past a 25 ms SLO from a few streams on, and routing sent the pool most of what that engine
would have served faster (`tiergate up`, 24 users, one run each: 110 of 507 requests on the
latency tier with streams that carried no usage, 648 of 708 with usage). So a stream whose
client did not ask for usage asks for it all the same (`stream_options.include_usage`, which
vLLM, Triton's adapter and the simulator honour), and the usage-only event (`"choices":[]`) is
taken out of what the client gets: it sees the stream it asked for, and the gateway counts
real tokens.
"""

from __future__ import annotations

from gateway.core.exchange import Exchange
from gateway.core.sse import skip_space

__all__ = ["ask_usage", "without_usage_events"]

_MARK = b'"choices":[]'  # a usage-only event's, as vLLM (and every compact writer) sends it
_KEY = b'"choices"'
_ASK = b',"stream_options":{"include_usage":true}}'


def without_usage_events(body: bytes) -> bytes:
    """`body` (whole SSE events) without the usage-only events (`"choices":[]`): each cut out
    where it is found, the others left as they are. (A stream's events reach it only where
    they hold a usage object: gateway.pipeline.upstream.)"""
    i = _usage_only(body, 0)
    if i == -1:
        return body
    kept: list[bytes] = []
    start = 0
    while i != -1:
        begin = body.rfind(b"\n\n", start, i)
        begin = start if begin == -1 else begin + 2
        end = body.find(b"\n\n", i)
        if end == -1:  # the last event, unterminated: the separator before it goes too
            kept.append(body[start : max(begin - 2, start)])
            out = b"".join(kept)
            # (that separator already kept, where another usage event came just before)
            return out[:-2] if begin == start and out.endswith(b"\n\n") else out
        kept.append(body[start:begin])
        start = end + 2
        i = _usage_only(body, start)
    kept.append(body[start:])
    return b"".join(kept)


def _usage_only(body: bytes, start: int) -> int:
    """Where the next usage-only event's mark begins from `start` (-1: none): `"choices":[]`,
    or with JSON's whitespace in it (`"choices": []` from an engine writing its JSON with
    Python's `json.dumps` defaults), looked for only where the compact form is not found (an
    engine writes a stream's events alike). Searched with `find`: a regular expression's
    search cost ~40,000 instructions a stream (sre tries every `"` of the JSON)."""
    i = body.find(_MARK, start)
    if i != -1:
        return i
    i = body.find(_KEY, start)
    while i != -1:
        if _empty_array(body, i + len(_KEY)):
            return i
        i = body.find(_KEY, i + 1)
    return -1


def _empty_array(body: bytes, j: int) -> bool:
    """Whether `: []` (JSON's whitespace anywhere in it) comes at `j`."""
    for expected in b":[]":
        j = skip_space(body, j)
        if j == len(body) or body[j] != expected:
            return False
        j += 1
    return True


def ask_usage(ex: Exchange) -> None:
    """For a stream whose client did not ask for usage: ask the engine for it, and strip the
    usage event from what the client gets."""
    if not ex.stream:
        return
    data = ex.data
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        return
    body = ex.body.rstrip()
    if "stream_options" not in data and body.endswith(b"}"):
        # One more member spliced in before the object's end: the body is not re-encoded (a
        # long chat history would cost a JSON encoding per request). Not empty: `stream` is in.
        ex.body = body[:-1] + _ASK
        data["stream_options"] = {"include_usage": True}
    else:
        ex.set_field("stream_options", {**(options if isinstance(options, dict) else {}),
                                        "include_usage": True})  # fmt: skip
    ex.body_filters.append(without_usage_events)
