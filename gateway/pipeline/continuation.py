"""Continuing a stream that broke after its first byte on another backend, so the client sees
one unbroken stream.

While a stream runs, the relay keeps a reference to each chunk it forwarded (no parsing on the
hot path). If the stream breaks (the engine dies, goes silent, or is ejected), `replay` reads
what the client was sent: the stream's id, the generated text, how many tokens that was, and
whether the engine had already finished. `continued_body` is the request that generates the
rest: the same request with the text so far appended (completions: to the prompt; chat: as a
partial assistant message, continued with vLLM's `continue_final_message`) and `max_tokens`
reduced by what was sent. `Splicer` rewrites the new stream's events into the client's: the
first stream's `id` and `created`, no second role delta, and a final `usage` that counts the
whole answer.

Tokens sent so far: the last `usage` the stream carried (with
`stream_options.continuous_usage_stats`), else one per event that carried text, which is
exact for plain decoding (vLLM sends one event per engine step) and an undercount with
speculative decoding (a step may carry several tokens) or when the detokenizer held a token
back (its text comes with the next).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.api import REASONING_FIELDS
from gateway.core.sse import event_data
from gateway.wire import StreamRelay

__all__ = ["Progress", "SplicedRelay", "Splicer", "continued_body", "replay", "whole_events"]

_DONE = b"[DONE]"


def whole_events(buffered: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """(the complete SSE events of `buffered + chunk`, the incomplete rest to hold back)."""
    data = buffered + chunk if buffered else chunk
    end = data.rfind(b"\n\n")
    if end == -1:
        return b"", data
    return data[: end + 2], data[end + 2 :]


def _events(chunks: Sequence[bytes]) -> list[Any]:
    """The JSON payloads of the complete `data:` events in `chunks` (not [DONE])."""
    out = []
    for event in b"".join(chunks).split(b"\n\n"):
        data = event_data(event.strip(b"\n"))
        if data is None:
            continue
        payload = data.strip()
        if payload == _DONE:
            continue
        try:
            out.append(json.loads(payload))
        except ValueError:
            continue  # an incomplete last event: the client never saw it whole either
    return out


@dataclass(frozen=True, slots=True)
class Progress:
    """What the client was sent of a stream."""

    id: str | None
    created: int | None
    text: str
    tokens: int
    finished: bool  # the engine sent a finish_reason: generation was over
    role_sent: bool  # chat: the assistant role delta was sent
    errored: bool  # the engine sent an error event: not a stream to continue
    # chat: a tool call's delta was sent. Not a stream to continue: the rest would start the
    # call again, and the client would join two calls' arguments into one broken JSON.
    called: bool = False


def replay(chunks: Sequence[bytes], chat: bool) -> Progress:
    text: list[str] = []
    ident: str | None = None
    created: int | None = None
    tokens = 0
    usage: int | None = None
    finished = role_sent = errored = called = False
    for ev in _events(chunks):
        if not isinstance(ev, dict):
            continue
        if "error" in ev:
            errored = True
            continue
        ident = ident or ev.get("id")
        created = created or ev.get("created")
        if isinstance(ev.get("usage"), dict):
            usage = ev["usage"].get("completion_tokens", usage)
        for choice in ev.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if chat:
                delta = choice.get("delta") or {}
                role_sent = role_sent or "role" in delta
                called = called or bool(delta.get("tool_calls"))
                piece = delta.get("content")
                # A reasoning model's reasoning: generated tokens (the limit counts them), not
                # the answer's text; counted once where a server sends it under both names.
                if any(isinstance(t := delta.get(k), str) and t for k in REASONING_FIELDS):
                    tokens += 1
            else:
                piece = choice.get("text")
            if isinstance(piece, str) and piece:  # not the chat role event's ""
                text.append(piece)
                tokens += 1
            if choice.get("finish_reason") is not None:
                finished = True
    return Progress(ident, created, "".join(text), usage if usage is not None else tokens,
                    finished, role_sent, errored, called)  # fmt: skip


def continued_body(data: dict[str, Any], chat: bool, progress: Progress) -> dict[str, Any] | None:
    """The request that generates the rest of the answer, or None when it cannot be continued
    (nothing left to generate, several choices, a prompt of token ids, a tool call begun)."""
    if data.get("n", 1) != 1 or progress.finished or progress.errored or progress.called:
        return None
    body = dict(data)
    key = "max_completion_tokens" if chat and data.get("max_completion_tokens") else "max_tokens"
    limit = data.get(key, None if chat else 16)  # vLLM's defaults: 16 for completions
    if limit is not None:
        if not isinstance(limit, int) or limit - progress.tokens < 1:
            return None
        body[key] = limit - progress.tokens
    if "min_tokens" in data and isinstance(data["min_tokens"], int):
        body["min_tokens"] = max(0, data["min_tokens"] - progress.tokens)
    if chat:
        messages = list(data.get("messages") or [])
        if data.get("continue_final_message") and messages:
            last = dict(messages[-1])
            if not isinstance(last.get("content"), str):
                return None
            last["content"] += progress.text
            messages[-1] = last
        else:
            messages.append({"role": "assistant", "content": progress.text})
        body["messages"] = messages
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or data.get("echo"):
            return None
        body["prompt"] = prompt + progress.text
    return body


class Splicer:
    """Rewrites a continuation's events into the stream the client is reading."""

    __slots__ = ("buffered", "chat", "progress")

    def __init__(self, progress: Progress, chat: bool) -> None:
        self.progress, self.chat = progress, chat
        self.buffered = b""

    def feed(self, chunk: bytes) -> bytes:
        events, self.buffered = whole_events(self.buffered, chunk)
        if not events:
            return b""
        out = []
        for event in events.split(b"\n\n"):
            event = event.strip(b"\n")
            if not event:
                continue
            data = event_data(event)
            if data is None or data.strip() == _DONE:
                out.append(event + b"\n\n")
                continue
            try:
                ev = json.loads(data)
            except ValueError:
                continue
            ev = self._rewrite(ev)
            if ev is not None:
                # The event's other fields (`id:`, `event:`) as the engine sent them, then its
                # data rewritten on one line.
                for line in event.split(b"\n"):
                    if not line.startswith(b"data"):
                        out.append(line + b"\n")
                out.append(b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n")
        return b"".join(out)

    def _rewrite(self, ev: Any) -> Any:
        if not isinstance(ev, dict) or "error" in ev:
            return ev
        p = self.progress
        if p.id is not None:
            ev["id"] = p.id
        if p.created is not None:
            ev["created"] = p.created
        if self.chat:
            for choice in ev.get("choices") or ():
                delta = choice.get("delta") if isinstance(choice, dict) else None
                if isinstance(delta, dict) and "role" in delta and p.role_sent:
                    del delta["role"]
                    if not any(delta.values()) and choice.get("finish_reason") is None:
                        return None  # the role-only first event: the client has had one
        usage = ev.get("usage")
        if isinstance(usage, dict):
            done, prompt = usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0)
            # The continuation's prompt held the text so far: those tokens were completion.
            usage["prompt_tokens"] = max(0, prompt - p.tokens)
            usage["completion_tokens"] = done + p.tokens
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return ev


class SplicedRelay:
    """A continuation's stream relay: the engine's relay counts (telemetry's view: the whole
    answer, the part before included), the splicer writes what the client gets."""

    __slots__ = ("completion_tokens", "engine_error", "inner", "splicer", "text_events")

    def __init__(self, inner: StreamRelay, progress: Progress, chat: bool) -> None:
        self.inner, self.splicer = inner, Splicer(progress, chat)
        self.text_events = progress.tokens
        self.completion_tokens: int | None = None
        self.engine_error = False

    @property
    def carried_usage(self) -> bool:
        return self.inner.carried_usage  # the splicer rewrites the counts, the event stays

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        inner, before = self.inner, self.splicer.progress.tokens
        _, text = inner.feed(chunk)
        self.text_events = before + inner.text_events
        if inner.completion_tokens is not None:
            self.completion_tokens = before + inner.completion_tokens
        self.engine_error = inner.engine_error
        return self.splicer.feed(chunk), text

    def close(self) -> bytes:
        return self.splicer.feed(self.inner.close())

    def fail(self, message: str, status: int = 502) -> bytes:
        return self.inner.fail(message, status)
