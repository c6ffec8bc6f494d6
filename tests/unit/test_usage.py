"""Every stream asks its engine for usage (gateway.pipeline.usage): what is forwarded for each
way a client may or may not ask, and what the client gets back."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from gateway.core.exchange import Exchange
from gateway.pipeline.usage import ask_usage

ASKED = {"include_usage": True}


def exchange(body: bytes, sent: list[bytes]) -> Exchange:
    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message.get("body", b""))

    ex = Exchange.__new__(Exchange)
    ex.body, ex.data = body, json.loads(body)
    ex.stream = bool(ex.data.get("stream"))
    ex.send = send
    ex.body_filters = []
    return ex


@pytest.mark.parametrize(
    ("case", "body", "forwarded", "strips"),
    [
        ("not a stream: untouched", b'{"prompt":"a","max_tokens":2}', None, False),
        ("a stream without options: asked", b'{"prompt":"a","stream":true}\n',
         {"prompt": "a", "stream": True, "stream_options": ASKED}, True),
        ("the client asked: untouched", b'{"stream":true,"stream_options":{"include_usage":true}}',
         None, False),
        ("other options kept", b'{"stream":true,"stream_options":{"continuous_usage_stats":true}}',
         {"stream": True, "stream_options": {"continuous_usage_stats": True, **ASKED}}, True),
        ("asked not to: asked, and stripped",
         b'{"stream":true,"stream_options":{"include_usage":false}}',
         {"stream": True, "stream_options": ASKED}, True),
        ("null options", b'{"stream":true,"stream_options":null}',
         {"stream": True, "stream_options": ASKED}, True),
    ],
)  # fmt: skip
async def test_what_is_forwarded_and_what_the_client_gets(
    case: str, body: bytes, forwarded: dict[str, Any] | None, strips: bool
) -> None:
    sent: list[bytes] = []
    ex = exchange(body, sent)
    ask_usage(ex)
    if forwarded is None:
        assert ex.body == body, case
    else:
        assert json.loads(ex.body) == ex.data == forwarded, case
    usage = b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\n'
    text = b'data: {"choices":[{"text":"a"}]}\n\n'
    await ex.send_body(text + usage + b"data: [DONE]\n\n")  # as every body goes out
    assert sent == [text + b"data: [DONE]\n\n" if strips else text + usage + b"data: [DONE]\n\n"]
