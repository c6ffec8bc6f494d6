"""Mid-stream continuation (pipeline.continuation): what a broken stream sent, the request for
the rest, and the splice into the client's stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.pipeline.continuation import Progress, Splicer, continued_body, replay, whole_events


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, str) else json.dumps(e)).encode() + b"\n\n"
                    for e in events)  # fmt: skip


def comp(text: str, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra}  # fmt: skip


def chat(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chat-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


@pytest.mark.parametrize(
    ("buffered", "chunk", "out", "held"),
    [
        (b"", b"data: a\n\ndata: b\n\n", b"data: a\n\ndata: b\n\n", b""),
        (b"", b"data: a\n\ndata: b", b"data: a\n\n", b"data: b"),
        (b"data: b", b"c\n\n", b"data: bc\n\n", b""),
        (b"", b"data: par", b"", b"data: par"),
    ],
)
def test_only_whole_events_go_out(buffered: bytes, chunk: bytes, out: bytes, held: bytes) -> None:
    assert whole_events(buffered, chunk) == (out, held)


def test_replay_reads_what_the_client_was_sent() -> None:
    chunks = [sse(comp(" one"), comp(" two")), sse(comp(" three")), b'data: {"id":"cm']
    p = replay(chunks, chat=False)
    assert p == Progress("cmpl-1", 7, " one two three", 3, False, False, False)


def test_replay_prefers_the_streams_own_token_count() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    p = replay([sse(comp(" a b"), comp(" c d e", usage=usage))], chat=False)
    assert p.tokens == 5  # speculative steps: 2 events, 5 tokens


def test_replay_of_chat_notes_the_role_and_a_finish() -> None:
    p = replay([sse(chat({"role": "assistant", "content": ""}), chat({"content": "Hi"}),
                    chat({"content": "!"}, finish="stop"))], chat=True)  # fmt: skip
    assert (p.text, p.tokens, p.role_sent, p.finished) == ("Hi!", 2, True, True)  # role: no token


def test_replay_of_chat_counts_reasoning_as_tokens_and_notes_a_tool_call() -> None:
    p = replay([sse(chat({"role": "assistant", "content": ""}), chat({"reasoning": "Let"}),
                    chat({"reasoning_content": " me"}), chat({"content": "Four"}))], chat=True)
    assert (p.text, p.tokens, p.called) == ("Four", 3, False)  # the limit counts the reasoning
    both = chat({"reasoning": "Let", "reasoning_content": "Let"})  # one token, under two names
    assert replay([sse(both)], chat=True).tokens == 1
    call = {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"ci'}}]}
    p = replay([sse(chat({"role": "assistant", "content": ""}), chat(call))], chat=True)
    assert p.called
    assert continued_body(BASE_CHAT, True, p) is None  # a call started again would be broken


BASE_COMP = {"model": "m", "prompt": "Say", "max_tokens": 10, "stream": True}
BASE_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10,
             "stream": True}  # fmt: skip


def progress(text: str = " x y", tokens: int = 2, **kw: Any) -> Progress:
    fields = {"id": "c", "created": 1, "text": text, "tokens": tokens, "finished": False,
              "role_sent": True, "errored": False, **kw}  # fmt: skip
    return Progress(**fields)


@pytest.mark.parametrize(
    ("data", "chat_", "p", "expect"),
    [
        (BASE_COMP, False, progress(), {"prompt": "Say x y", "max_tokens": 8}),
        ({**BASE_COMP, "prompt": ["Say"]}, False, progress(), {"prompt": "Say x y"}),
        ({k: v for k, v in BASE_COMP.items() if k != "max_tokens"}, False, progress(),
         {"max_tokens": 14}),  # vLLM's default of 16
        ({**BASE_COMP, "min_tokens": 5}, False, progress(), {"min_tokens": 3}),
        (BASE_CHAT, True, progress(),
         {"messages": [{"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": " x y"}],
          "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 8}),
        ({**BASE_CHAT, "max_tokens": None, "max_completion_tokens": 4}, True, progress(),
         {"max_completion_tokens": 2}),
        ({**BASE_CHAT, "max_tokens": None}, True, progress(), {"max_tokens": None}),
        # nothing to continue
        (BASE_COMP, False, progress(tokens=10), None),
        (BASE_COMP, False, progress(finished=True), None),
        (BASE_COMP, False, progress(errored=True), None),
        ({**BASE_COMP, "n": 2}, False, progress(), None),
        ({**BASE_COMP, "prompt": [1, 2, 3]}, False, progress(), None),
        ({**BASE_COMP, "echo": True}, False, progress(), None),
    ],
)  # fmt: skip
def test_the_request_for_the_rest(
    data: dict[str, Any], chat_: bool, p: Progress, expect: dict[str, Any] | None
) -> None:
    body = continued_body(data, chat_, p)
    if expect is None:
        assert body is None
        return
    assert body is not None
    assert {k: body.get(k) for k in expect} == expect
    assert body["stream"] is True


def test_a_continued_partial_assistant_message_grows() -> None:
    data = {**BASE_CHAT, "messages": [{"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Well,"}],
            "continue_final_message": True, "add_generation_prompt": False}  # fmt: skip
    body = continued_body(data, True, progress())
    assert body is not None
    assert body["messages"][-1] == {"role": "assistant", "content": "Well, x y"}
    assert data["messages"][-1]["content"] == "Well,"


def test_the_splice_keeps_the_first_streams_id_and_counts_the_whole_answer() -> None:
    s = Splicer(progress(tokens=2), chat=False)
    usage = {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}
    new = {**comp(" z"), "id": "cmpl-2", "created": 9}
    tail = sse({**new, "choices": [], "usage": usage}, "[DONE]")
    out = s.feed(sse(new)[:20]) + s.feed(sse(new)[20:] + tail)  # an event split across reads
    events = [e[6:] for e in out.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    first, last = json.loads(events[0]), json.loads(events[1])
    assert (first["id"], first["created"], first["choices"][0]["text"]) == ("c", 1, " z")
    # the continuation's prompt held the 2 tokens sent before: they were completion
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}


def test_the_splice_drops_a_second_role_delta() -> None:
    s = Splicer(progress(), chat=True)
    out = s.feed(
        sse(
            chat({"role": "assistant", "content": ""}),
            chat({"role": "assistant", "content": "more"}),
            chat({"content": "!"}),
        )
    )
    deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in out.decode().split("\n\n") if e]
    # the role-only event is gone; one with content keeps its content, not its role
    assert deltas == [{"content": "more"}, {"content": "!"}]


def other_forms(*events: dict[str, Any] | str) -> bytes:
    """The same events in forms the SSE specification allows and vLLM does not use: an `id:`
    and an `event:` field and a comment before the data, and a JSON payload over several
    `data:` lines (joined by LF, which JSON reads as whitespace), the later ones with no space
    after the colon."""
    out = []
    for i, e in enumerate(events):
        text = e if isinstance(e, str) else json.dumps(e, indent=1)
        first, *rest = text.split("\n")
        data = f"data: {first}" + "".join(f"\ndata:{line}" for line in rest)
        out.append(f": keep-alive\nid: {i}\nevent: message\n{data}\n\n")
    return "".join(out).encode()


def test_replay_reads_events_with_other_fields_and_data_over_several_lines() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    chunks = [other_forms(comp(" one"), comp(" two")), other_forms(comp(" three", usage=usage))]
    same = [sse(comp(" one"), comp(" two"), comp(" three", usage=usage))]
    p = replay(chunks, chat=False)
    assert p == replay(same, chat=False)
    assert (p.text, p.tokens) == (" one two three", 4)


def test_the_splice_reads_events_with_other_fields_and_data_over_several_lines() -> None:
    s = Splicer(progress(tokens=2), chat=False)
    new = {**comp(" z"), "id": "cmpl-2", "created": 9}
    stream = other_forms(new, "[DONE]")
    out = b"".join(s.feed(stream[i : i + 7]) for i in range(0, len(stream), 7))
    events = [e for e in out.decode().split("\n\n") if e]
    assert len(events) == 2
    # Its fields kept, its data rewritten on one line with the first stream's id.
    head, _, data = events[0].rpartition("\n")
    assert head == ": keep-alive\nid: 0\nevent: message"
    first = json.loads(data.removeprefix("data: "))
    assert (first["id"], first["created"], first["choices"][0]["text"]) == ("c", 1, " z")
    assert events[1].endswith("data: [DONE]")
