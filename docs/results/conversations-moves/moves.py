"""The crowd phase of `tiergate bench conversations`, round after round, with what the engines
themselves measured: does a round where later turns left their first turn's instance serve its
requests worse or better than one where every turn stayed?

Per round, on a fresh `tiergate up` deployment (one v4 simulator, two v3, prefix caching on,
real time) behind a gateway with its defaults (the bench's scrape and probe intervals): 12 chats
one after another, then 32 at once (3 turns each, the bench's chats). For the 32 at once: the
share of later turns on their first turn's instance, the first turns per instance, and per engine
the requests it served, those whose TPOT was at most 25 ms (the gateway's default SLO; the
engine's own `vllm:request_time_per_output_token_seconds` histogram, bucket 0.025), their mean
TPOT, and the seconds the 32 chats took.

    python docs/results/conversations-moves/moves.py ROUNDS > runs.txt
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from loadtests import conversations as cv
from loadtests.harness.stack import start_stack

_TPOT = "vllm:request_time_per_output_token_seconds"


async def _tpot(session: aiohttp.ClientSession, url: str) -> tuple[float, float, float]:
    """(requests within 25 ms, requests, sum of their TPOTs) so far."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()

    def value(series: str) -> float:
        found = re.search(rf"^{re.escape(series)}(?:\{{[^}}]*\}})? ([\d.e+-]+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    within = re.search(rf'^{_TPOT}_bucket\{{[^}}]*le="0\.025"[^}}]*\}} ([\d.e+-]+)$', text, re.M)
    return (float(within.group(1)) if within else 0.0, value(f"{_TPOT}_count"),
            value(f"{_TPOT}_sum"))  # fmt: skip


async def _round(url: str, sims: list[str], opts: cv.Options) -> str:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        for i in range(opts.solo):
            await cv.converse(s, url, f"solo-{i}", opts)
        before = [await _tpot(s, u) for u in sims]
        t0 = time.perf_counter()
        crowd = await asyncio.gather(*(cv.converse(s, url, f"crowd-{i}", opts)
                                       for i in range(opts.crowd)))  # fmt: skip
        took = time.perf_counter() - t0
        after = [await _tpot(s, u) for u in sims]
    m = cv.measure(crowd)
    engines = []
    for name, a, b in zip(("v4", "v3-a", "v3-b"), after, before, strict=True):
        met, n, total = (x - y for x, y in zip(a, b, strict=True))
        mean = f"{1000 * total / n:.1f}" if n else "-"
        engines.append(f"{name} {met:.0f}/{n:.0f} mean {mean} ms")
    firsts = "+".join(map(str, m["first_turns"]))
    return (f"at home {m['at_home']}/{m['later_turns']} ({m['share']:.3f}), first turns {firsts}"
            f" | {' | '.join(engines)} | {took:.2f} s")  # fmt: skip


def main(rounds: int) -> None:
    opts = cv.Options()
    monitor = {"scrape_interval_s": 0.25, "probe_interval_s": 2.0}
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="tiergate-moves-") as tmp:
            stack = start_stack(Path(tmp), speedup=1.0, latency=1, throughput=2,
                                latency_args=("--prefix-caching",),
                                throughput_args=("--prefix-caching",), monitor=monitor)  # fmt: skip
            try:
                line = asyncio.run(_round(stack.gateway.url, [s.url for s in stack.sims], opts))
            finally:
                stack.stop()
        print(f"round {r + 1}: {line}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
