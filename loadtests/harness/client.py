"""A small async closed-loop streaming client, timing requests as `vllm bench serve` does.

Per request (see the benchmark method): TTFT = first chunk carrying text, E2E = last chunk carrying
text, N = `usage.completion_tokens`, TPOT = (E2E - TTFT) / (N - 1). Each chunk's arrival time and
word count are kept too, so throughput can be computed over a window in which every user is
active (the simulator emits one word per token, so words are tokens there).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp


@dataclass(slots=True)
class Result:
    user: int
    index: int  # n-th request of that user, from 1
    sent: float
    status: int = 0
    ttft: float | None = None
    e2e: float | None = None
    tokens: int = 0
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (time, words)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def error_kind(self) -> str | None:
        """What went wrong, in a word the reports can count: the HTTP status of an answer
        other than 200, the `type` of an error event in a stream, or the client's exception
        (a timeout, a broken connection); None for a request that succeeded."""
        if self.ok:
            return None
        if self.status and self.status != 200:
            return f"HTTP {self.status}"
        text = self.error or ""
        try:
            event = json.loads(text)
        except ValueError:
            return text.split(":", 1)[0] or "unknown"
        kind = (event.get("type") or event.get("code")) if isinstance(event, dict) else None
        return f"stream error {kind}" if kind else "stream error"

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.tokens - 1)


def prompt_of(tokens: int) -> str:
    """A prompt of exactly `tokens` tokens under the simulator's counting rule (one per word)."""
    return " ".join(["hello"] * tokens)


async def stream_completion(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    result: Result,
    headers: dict[str, str] | None = None,
) -> Result:
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            result.status = resp.status
            result.headers = {k.lower(): v for k, v in resp.headers.items() if k.lower().startswith(
                "x-tiergate")}  # fmt: skip
            if resp.status != 200:
                result.error = (await resp.text())[:500]
                return result
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = json.dumps(chunk["error"])[:500]
                    break
                if chunk.get("usage"):
                    result.tokens = int(chunk["usage"]["completion_tokens"])
                for choice in chunk.get("choices", ()):
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        if result.ttft is None:
                            result.ttft = now - result.sent
                        result.e2e = now - result.sent
                        result.chunks.append((now, len(text.split())))
    except (TimeoutError, aiohttp.ClientError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


@dataclass(frozen=True, slots=True)
class LoopStats:
    concurrency: int
    results: tuple[Result, ...]
    tok_s: float
    window_s: float

    def measured(self) -> list[Result]:
        """Completed requests after each user's first (warm-up) one."""
        return [r for r in self.results if r.ok and r.index > 1] or [
            r for r in self.results if r.ok
        ]

    def median(self, what: str) -> float:
        values = [v for r in self.measured() if (v := getattr(r, what)) is not None]
        return statistics.median(values) if values else float("nan")

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.results)


async def closed_loop(
    url: str,
    concurrency: int,
    *,
    prompt_tokens: int = 50,
    output_tokens: int = 256,
    requests_per_user: int = 3,
    model: str | None = None,
    stagger_s: float = 0.0,
    headers: dict[str, str] | None = None,
    on_done: Callable[[Result], None] | None = None,
) -> LoopStats:
    """`concurrency` users, each sending its next request when the last finished. The users'
    first requests are spread over `stagger_s` so that arrivals are not in lockstep."""
    body: dict[str, object] = {
        "prompt": prompt_of(prompt_tokens),
        "max_tokens": output_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    results: list[Result] = []
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

        async def user(u: int) -> None:
            await asyncio.sleep(u * stagger_s / concurrency)
            for i in range(1, requests_per_user + 1):
                r = await stream_completion(
                    session, url, body, Result(u, i, time.perf_counter()), headers
                )
                results.append(r)
                if on_done:
                    on_done(r)

        await asyncio.gather(*(user(u) for u in range(concurrency)))
    return LoopStats(concurrency, tuple(results), *window_throughput(results, requests_per_user))


def window_throughput(results: Sequence[Result], requests_per_user: int) -> tuple[float, float]:
    """Tokens per second over the window in which every user is active: from the end of the last
    warm-up request to the end of the first user's last request."""
    firsts = [r.sent + (r.e2e or 0.0) for r in results if r.index == 1]
    lasts = [r.sent + (r.e2e or 0.0) for r in results if r.index == requests_per_user]
    if not firsts or not lasts:
        return float("nan"), 0.0
    start, end = max(firsts), min(lasts)
    if end <= start:  # a single request per user: fall back to the whole run
        start = min(r.sent for r in results)
        end = max(r.sent + (r.e2e or 0.0) for r in results)
    words = sum(n for r in results for t, n in r.chunks if start < t <= end)
    span = end - start
    return (words / span if span > 0 else float("nan")), span


def event_loop_runner() -> asyncio.Runner:
    # The gateway and the simulator run on uvloop; so does the client when it can, so that the
    # client's share of the (shared) CPU stays as small as possible.
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)
