"""Deterministic text for the simulator: how prompts are counted and what the engine "says".

Prompt tokens, the documented rule:
- a string prompt counts one token per whitespace-separated word (`len(text.split())`), at least 1;
- a list of token ids counts its length;
- a chat conversation counts, per message, the words of its content plus 4 (role and separators),
  plus 3 for the assistant header the template appends.
So a benchmark that wants a 50-token prompt sends 50 words. The tokens themselves (what prefix
caching compares) are those words, the ids of a token-id prompt, and for a chat each message
rendered as `<|start|> role <|sep|> words... <|end|>` followed by `<|start|> assistant <|sep|>`.
That header is an assistant message's opening, so a next turn that sends the conversation back
with the reply as an assistant message extends this prompt and its output token for token; so
does a completion prompt followed by its returned text.

Output text: one word per token, each with a leading space, from a fixed vocabulary in an order
that depends only on the request's seed (default 0), so replies are reproducible and a `stop`
string can be aimed at.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

VOCAB: tuple[str, ...] = (
    "the", "engine", "serves", "tokens", "in", "batches", "while", "paged", "attention",
    "keeps", "cache", "blocks", "small", "and", "speculative", "drafts", "are", "verified",
    "by", "a", "larger", "model", "so", "latency", "falls", "when", "load", "is", "light",
    "but", "throughput", "wins", "under", "pressure", "of", "many", "concurrent", "streams",
    "scheduler", "admits", "requests", "from", "queue", "until", "memory", "runs", "out",
)  # fmt: skip

CHAT_MESSAGE_OVERHEAD = 4
CHAT_REPLY_HEADER = 3


def count_text(text: str) -> int:
    return max(1, len(text.split()))


def count_prompt(prompt: str | Sequence[int]) -> int:
    if isinstance(prompt, str):
        return count_text(prompt)
    return max(1, len(prompt))


def count_chat(contents: Sequence[str]) -> int:
    words = sum(len(c.split()) + CHAT_MESSAGE_OVERHEAD for c in contents)
    return words + CHAT_REPLY_HEADER


def prompt_tokens(prompt: str | Sequence[int]) -> list[str] | list[int]:
    """The tokens of a completion prompt (words, or the ids given), as counted by count_prompt."""
    return prompt.split() if isinstance(prompt, str) else list(prompt)


def chat_tokens(messages: Sequence[tuple[str, str]]) -> list[str]:
    """The rendered conversation of (role, content) pairs: count_chat tokens of it."""
    out: list[str] = []
    for role, content in messages:
        out += ["<|start|>", role, "<|sep|>", *content.split(), "<|end|>"]
    # The opening of an assistant message, so the reply continues it as a later turn renders it.
    return [*out, "<|start|>", "assistant", "<|sep|>"]


def word(seed: int, i: int) -> str:
    """The i-th output token for a given seed."""
    return " " + VOCAB[(seed * 7919 + i * 31 + (i * i) % 7) % len(VOCAB)]


def output_tokens(seed: int, n: int) -> list[str]:
    """The first n output tokens as a later prompt repeating the reply counts them (its words)."""
    return [word(seed, i).strip() for i in range(n)]


def text_of(seed: int, start: int, stop: int) -> str:
    return "".join(word(seed, i) for i in range(start, stop))


def natural_length(key: str, mean: int) -> int:
    """Where the simulated model would emit EOS: deterministic per prompt, 25%..175% of mean."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big")
    return max(1, mean // 4 + h % max(1, (3 * mean) // 2))


@dataclass(frozen=True, slots=True)
class Plan:
    """How many tokens a request will produce and why it stops."""

    tokens: int
    finish_reason: str  # "length" | "stop"
    stop_reason: str | None


def plan_output(
    *,
    seed: int,
    max_tokens: int,
    min_tokens: int,
    ignore_eos: bool,
    stop: Sequence[str],
    natural: int,
) -> Plan:
    """Resolve max_tokens / min_tokens / ignore_eos / stop into an exact token count up front.

    A stop string ends the output at the token that completes it (the string itself is not
    returned, as in vLLM), but never before min_tokens.
    """
    limit = max_tokens
    reason, stop_reason = "length", None
    if not ignore_eos and natural < limit:
        limit, reason = max(natural, min_tokens), "stop"
        if limit >= max_tokens:
            limit, reason = max_tokens, "length"
    if stop:
        text = ""
        for i in range(limit):
            text += word(seed, i)
            if i + 1 < min_tokens:
                continue
            hit = next((s for s in stop if s and s in text), None)
            if hit is not None:
                return Plan(i + 1, "stop", hit)
    return Plan(limit, reason, stop_reason)


def visible_text(seed: int, n_tokens: int, stop_reason: str | None) -> str:
    """The full reply; a matched stop string and what follows it are cut off."""
    text = text_of(seed, 0, n_tokens)
    if stop_reason:
        text = text[: text.find(stop_reason)]
    return text
