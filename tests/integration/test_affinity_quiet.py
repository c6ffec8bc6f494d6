"""Prefix affinity's quiet state over real sockets: where prompts never repeat the gateway stops
remembering each one (`/state` says so), and a remembered prompt that comes again goes back to
the instance that served it and ends the quiet."""

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


def test_prompts_that_never_repeat_make_it_quiet_and_one_that_comes_again_goes_home(
    stack: Stack,
) -> None:
    with httpx.Client(base_url=stack.gateway.url, timeout=30) as c:

        def send(prompt: str) -> str:
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200
            return r.headers["x-tiergate-backend"]

        assert affinity(c) == {"keys": 0, "quiet": False}
        first = send("a prompt that comes again")
        for i in range(1, QUIET_AFTER):
            send(f"a prompt of its own, number {i}")
        assert affinity(c) == {"keys": QUIET_AFTER, "quiet": True}
        for i in range(200):
            send(f"another prompt of its own, number {i}")
        view = affinity(c)
        assert view["quiet"]
        assert 20 <= view["keys"] - QUIET_AFTER <= 90  # about one in four of 200 remembered
        assert send("a prompt that comes again") == first
        assert affinity(c)["quiet"] is False
