"""Prefix affinity's quiet state over real sockets: where prompts never repeat the gateway stops
remembering each one (`/state` says so); a chat's later turn then goes back to the instance that
served its first and ends the quiet, and so does a repeated prompt, once a repeat is drawn."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.stack import MODEL, Stack, start_stack

QUIET_AFTER = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    policy = {"name": "least-loaded", "affinity_quiet_after": QUIET_AFTER,
              "affinity_quiet_every": 4}  # fmt: skip
    s = start_stack(tmp_path_factory.mktemp("quiet"), latency=0, throughput=2, speedup=10,
                    policy=policy)  # fmt: skip
    yield s
    s.stop()


def affinity(c: httpx.Client) -> dict[str, Any]:
    view = c.get("/state").json()["affinity"]
    assert isinstance(view, dict)
    return view


def test_prompts_that_never_repeat_make_it_quiet_and_a_later_turn_goes_home(
    stack: Stack,
) -> None:
    opening = [{"role": "system", "content": "You answer in one word."},
               {"role": "user", "content": "A chat that comes back: its first turn."}]  # fmt: skip
    with httpx.Client(base_url=stack.gateway.url, timeout=30) as c:

        def send(prompt: str) -> str:
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200
            return r.headers["x-tiergate-backend"]

        def chat(messages: list[dict[str, str]]) -> str:
            r = c.post("/v1/chat/completions",
                       json={"model": MODEL, "messages": messages, "max_tokens": 2})  # fmt: skip
            assert r.status_code == 200
            return r.headers["x-tiergate-backend"]

        assert affinity(c) == {"keys": 0, "quiet": False}
        first = chat(opening)
        again = send("a prompt that comes again")
        for i in range(2, QUIET_AFTER):
            send(f"a prompt of its own, number {i}")
        assert affinity(c) == {"keys": QUIET_AFTER, "quiet": True}
        for i in range(200):
            send(f"another prompt of its own, number {i}")
        view = affinity(c)
        assert view["quiet"]
        assert 20 <= view["keys"] - QUIET_AFTER <= 90  # about one in four of 200 remembered
        later = [*opening, {"role": "assistant", "content": "Yes."},
                 {"role": "user", "content": "And its second."}]  # fmt: skip
        assert chat(later) == first
        assert affinity(c)["quiet"] is False
        # Quiet again; a completion shows no turns: its repeat is looked up once one is drawn
        # (one in four), which goes home and ends the quiet.
        for i in range(QUIET_AFTER):
            send(f"yet another prompt of its own, number {i}")
        assert affinity(c)["quiet"]
        for _ in range(100):  # all 100 not drawn: 0.75^100, 3e-13
            backend = send("a prompt that comes again")
            if not affinity(c)["quiet"]:
                break
        assert not affinity(c)["quiet"]
        assert backend == again
