"""Conversations stick with the gateway's defaults: multi-turn chats through the official
`openai` client, against a latency simulator and a throughput pool of two with prefix caching
on (as `tiergate up` starts them), the default policy and affinity settings. Later turns land on
the instance that served their conversation's first turn, one chat at a time and 32 at once,
while the chats at once still spread over more than one instance; their prompts find the
earlier turns in that instance's prefix cache. With the defaults a conversation on a pool
engine may instead come up to the latency engine once that adds over twice the output
(`policy.affinity_yield`); with that off, later turns stay home."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from loadtests.conversations import SYSTEM
from tests.integration.stack import MODEL, Stack, add_gateway, affinity_outcomes, start_stack

# Bounds on time and placement: run after the parallel tests, alone (scripts/test).
pytestmark = pytest.mark.serial

TURNS = 3
SHARE = 0.95  # of later turns on the first turn's instance


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("conversations"), latency=1, throughput=2,
                    latency_args=("--prefix-caching",),
                    throughput_args=("--prefix-caching",))  # fmt: skip
    yield s
    s.stop()


@dataclass
class Chat:
    backends: list[str] = field(default_factory=list)  # per turn, x-tiergate-backend
    cached: list[int] = field(default_factory=list)  # per turn, usage's cached tokens


async def converse(client: openai.AsyncOpenAI, name: str) -> Chat:
    chat = Chat()
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"{name} asks question {turn} " * 6})
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=24,  # type: ignore[arg-type]
        )
        reply = raw.parse()
        chat.backends.append(raw.headers["x-tiergate-backend"])
        details = reply.usage.prompt_tokens_details if reply.usage else None
        chat.cached.append((details.cached_tokens or 0) if details else 0)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    return chat


def later_turns(chats: list[Chat], up: str | None = None) -> tuple[int, int]:
    """(later turns on their first turn's instance, or on `up`'s, later turns)."""
    stuck = sum(b in (c.backends[0], up) for c in chats for b in c.backends[1:])
    return stuck, sum(len(c.backends) - 1 for c in chats)


def moved(chats: list[Chat]) -> list[list[str]]:
    """The chats with a later turn away from their first turn's instance, each's instances by
    port (what a failure shows beside the gateway's own count of what affinity did)."""
    return [[b.rsplit(":", 1)[-1] for b in c.backends] for c in chats
            if any(b != c.backends[0] for b in c.backends[1:])]  # fmt: skip


def client(stack: Stack, url: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=(url or stack.gateway.url) + "/v1", api_key="EMPTY",
                              max_retries=0, timeout=60)  # fmt: skip


def crowd(stack: Stack, url: str | None = None, name: str = "crowd") -> list[Chat]:
    async def run() -> list[Chat]:
        async with client(stack, url) as c:
            return await asyncio.gather(*(converse(c, f"{name}-{i}") for i in range(32)))

    return asyncio.run(run())


def test_chats_one_at_a_time_stay_on_their_instance(stack: Stack) -> None:
    async def run() -> list[Chat]:
        async with client(stack) as c:
            return [await converse(c, f"solo-{i}") for i in range(12)]

    chats = asyncio.run(run())
    stuck, later = later_turns(chats)
    assert stuck >= SHARE * later, (affinity_outcomes(stack.gateway.url), moved(chats))
    # Each later turn found at least the system prompt and its first turn cached there.
    for c in chats:
        for turn, cached in enumerate(c.cached[1:], 1):
            if c.backends[turn] == c.backends[0]:
                assert cached >= 320, (c.backends, c.cached)


def test_32_chats_at_once_stay_on_their_instances_and_spread(stack: Stack) -> None:
    """Later turns home, or come up to the latency engine (the defaults' `affinity_yield`)."""
    chats = crowd(stack)
    stuck, later = later_turns(chats, up=stack.latency[0].url)
    firsts = Counter(c.backends[0] for c in chats)
    assert stuck >= SHARE * later, (stuck, later, affinity_outcomes(stack.gateway.url),
                                    moved(chats))  # fmt: skip
    assert len(firsts) > 1, firsts


def test_without_moving_up_32_chats_at_once_stay_home(stack: Stack, tmp_path: Path) -> None:
    gw = add_gateway(stack, tmp_path, "stay", policy={"affinity_yield": 0})
    chats = crowd(stack, gw.url, "stay")
    stuck, later = later_turns(chats)
    assert stuck >= SHARE * later, (stuck, later, affinity_outcomes(gw.url), moved(chats))
    assert len(Counter(c.backends[0] for c in chats)) > 1
