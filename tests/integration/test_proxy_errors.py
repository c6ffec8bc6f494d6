"""The proxy endpoint's last line of defence, in process: a bug on the request path answers
500 in OpenAI's shape (never a stack trace), once, and only while nothing has been sent."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from gateway.config.settings import load_settings
from gateway.core.exchange import NO_DECISION, Exchange
from gateway.routing import Decision
from gateway.serve.app import COMPLETIONS, Proxy
from gateway.serve.assembly import Gateway, open_gateway
from tests.conftest import free_port


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    # A backend nobody listens on: the monitor's scrapes fail quietly, no request goes out.
    url = f"http://127.0.0.1:{free_port()}"
    tier = {"name": "t", "role": "throughput", "backends": [{"url": url, "models": ["m"]}]}
    settings = load_settings(None, tiers=[tier])
    async with open_gateway(settings) as gw:
        yield gw


async def call(gw: Gateway) -> list[MutableMapping[str, Any]]:
    body = {"model": "m", "prompt": "hi"}
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.request", "body": b""}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": [], "state": {"gateway": gw}}
    await Proxy(COMPLETIONS)(scope, receive, send)
    return sent


async def test_a_bug_before_the_answer_is_a_500_in_openai_shape(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(ex: Exchange) -> Decision:
        raise RuntimeError("a bug")

    monkeypatch.setattr(gateway.admission, "admit", broken)
    sent = await call(gateway)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 500
    err = json.loads(sent[1]["body"])["error"]
    assert (err["code"], err["type"]) == (500, "InternalServerError")
    assert "a bug" not in err["message"]  # the details go to the log, not to the client
    assert "a bug" in caplog.text


async def test_a_bug_after_the_answer_started_sends_nothing_more(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def half(ex: Exchange, decision: Decision) -> None:
        await ex.start_response(200, [])
        raise RuntimeError("a bug mid-stream")

    monkeypatch.setattr(gateway.upstream, "forward", half)
    monkeypatch.setattr(gateway.admission, "admit", _any_decision)
    sent = await call(gateway)
    assert [m["type"] for m in sent] == ["http.response.start"]


async def _any_decision(ex: Exchange) -> Decision:
    return NO_DECISION
