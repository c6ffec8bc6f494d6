"""Closed-loop load whose number of users changes by phase (step and burst shapes), and the
per-phase figures a routing comparison needs: TTFT/TPOT percentiles, output tokens/s, goodput.

A user active in a phase sends its next request as soon as the last one finished; when the phase
ends and the user is no longer wanted, it stops after its current request (nothing is cut off).
A request belongs to the phase in which it *finished*; tokens/s counts the tokens that arrived
during the phase.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from loadtests.common.stats import percentile
from loadtests.harness.client import Result, prompt_of, stream_completion

STEP: tuple[int, ...] = (1, 8, 16, 32, 64, 16)
BURST: tuple[int, ...] = (8, 64, 8, 64, 8)
SHAPES = {"step": STEP, "burst": BURST}


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 1.0
    tpot_s: float = 0.025

    def met(self, r: Result, scale: float = 1.0) -> bool:
        tpot = r.tpot
        return (
            r.ok
            and r.ttft is not None
            and r.ttft * scale <= self.ttft_s
            and (tpot is None or tpot * scale <= self.tpot_s)
        )


@dataclass(frozen=True, slots=True)
class PhaseStats:
    phase: int
    users: int
    seconds: float
    requests: int
    errors: int
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    tok_s: float
    goodput: float  # requests meeting every SLO, per second
    by_tier: dict[str, int]
    errors_by_kind: dict[str, int] = field(default_factory=dict)  # Result.error_kind: count


async def run_phases(
    url: str,
    users: Sequence[int],
    phase_s: float,
    *,
    prompt_tokens: int = 50,
    output_tokens: int = 256,
    model: str | None = None,
    on_done: Callable[[Result], None] | None = None,
    headers: dict[str, str] | None = None,
    on_phase: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[list[Result], list[float]]:
    """Drive the shape; returns every request and the phases' start times (plus the end).
    `headers` go with every request; `on_phase(i)` is awaited as phase i starts."""
    body: dict[str, object] = {
        "prompt": prompt_of(prompt_tokens), "max_tokens": output_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    if model:
        body["model"] = model
    wanted = [0]
    results: list[Result] = []
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

        async def user(u: int) -> None:
            n = 0
            while u < wanted[0]:
                n += 1
                r = await stream_completion(session, url, body, Result(u, n, time.perf_counter()),
                                            headers)  # fmt: skip
                results.append(r)
                if on_done:
                    on_done(r)

        running: dict[int, asyncio.Task[None]] = {}
        starts = []
        for i, target in enumerate(users):
            if on_phase is not None:
                await on_phase(i)
            starts.append(time.perf_counter())
            wanted[0] = target
            for u in range(target):
                if u not in running or running[u].done():
                    running[u] = asyncio.create_task(user(u))
            await asyncio.sleep(phase_s)
        starts.append(time.perf_counter())
        wanted[0] = 0
        await asyncio.gather(*running.values())
    return results, starts


Run = tuple[Sequence[Result], Sequence[float]]  # requests, phase start times (+ end)


def phase_stats(
    runs: Sequence[Run], users: Sequence[int], slo: Slo, scale: float = 1.0
) -> list[PhaseStats]:
    """Per-phase figures pooled over runs of the same shape; `scale` converts times back to
    model time when the engines ran faster than real time."""
    out = []
    for i, n_users in enumerate(users):
        done: list[Result] = []
        tokens = 0
        span = 0.0
        for results, starts in runs:
            t0, t1 = starts[i], starts[i + 1]
            done += [r for r in results if t0 <= r.sent + (r.e2e or 0.0) < t1]
            tokens += sum(n for r in results for t, n in r.chunks if t0 <= t < t1)
            span += (t1 - t0) * scale
        ok = [r for r in done if r.ok]
        ttft = [r.ttft * scale for r in ok if r.ttft is not None]
        tpot = [t * scale for r in ok if (t := r.tpot) is not None]
        tiers = Counter(r.headers.get("x-tiergate-tier", "none") for r in done)
        kinds = Counter(kind for r in done if (kind := r.error_kind) is not None)
        out.append(PhaseStats(
            i, n_users, span, len(done), len(done) - len(ok),
            percentile(ttft, 50), percentile(ttft, 99), percentile(tpot, 50), percentile(tpot, 99),
            tokens / span, sum(slo.met(r, scale) for r in done) / span, dict(tiers), dict(kinds),
        ))  # fmt: skip
    return out
