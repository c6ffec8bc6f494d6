"""Load on an OpenAI-compatible proxy and the engine behind it, as the overhead-style benches
drive it: small and streamed bodies, closed and paced loops timing each answer, wrk's Lua
script and its output, and the gateway's configuration in front of one simulator."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.common.stats import Samples, cpu_split
from loadtests.harness.client import Result, stream_completion

PROFILE = "instant"


JSON_HEADERS = {"Content-Type": "application/json"}


STREAM_TOKENS = 32


SSE_TOKENS = 64


def gateway_config(sim_url: str, model: str) -> dict[str, Any]:
    return {
        "tiers": [
            {
                "name": "pool",
                "role": "throughput",
                "backends": [{"url": sim_url, "models": [model]}],
            }
        ],
        "log_level": "warning",
    }


def small_body(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "hello", "max_tokens": 4, "ignore_eos": True}


def stream_body(model: str, tokens: int, usage: bool) -> dict[str, Any]:
    body: dict[str, Any] = {**small_body(model), "max_tokens": tokens, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


def client_session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=60, sock_connect=5),
    )


async def post_ok(session: aiohttp.ClientSession, url: str, payload: bytes) -> bool:
    try:
        async with session.post(url, data=payload, headers=JSON_HEADERS) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def warm(session: aiohttp.ClientSession, url: str, payload: bytes, n: int) -> None:
    """Open the pool's connections before timing: connection setup is not the per-request cost
    a keep-alive client pays."""
    await asyncio.gather(*(post_ok(session, url, payload) for _ in range(n)))


async def closed_small(
    url: str, payload: bytes, connections: int, duration_s: float, pids: Sequence[int] = ()
) -> Samples:
    """`connections` users, each sending its next request as soon as the last one answered.
    The CPU of `pids` is counted over the timed window (after the warm-up)."""
    out = Samples()
    async with client_session(connections) as session:
        await warm(session, url, payload, connections)
        cpu0 = cpu_split(pids)
        start = time.perf_counter()
        deadline = start + duration_s

        async def user() -> None:
            while (t0 := time.perf_counter()) < deadline:
                ok = await post_ok(session, url, payload)
                out.add(ok, time.perf_counter() - t0)

        await asyncio.gather(*(user() for _ in range(connections)))
        out.wall_s = time.perf_counter() - start
        out.charge(cpu0, cpu_split(pids))
    return out


async def paced_small(
    url: str,
    payload: bytes,
    connections: int,
    rate: float,
    duration_s: float,
    pids: Sequence[int] = (),
) -> Samples:
    """Open loop: `rate` requests/s in all, connection c sending at c/rate + k*connections/rate.
    Each latency is measured from the scheduled start, so a request that starts late because the
    previous one on its connection (or the client) was slow is charged for the wait."""
    out = Samples()
    period = connections / rate
    async with client_session(connections) as session:
        await warm(session, url, payload, connections)
        cpu0 = cpu_split(pids)
        start = time.perf_counter() + 0.005
        ends: list[float] = [start]

        async def pacer(c: int) -> None:
            due = start + c / rate
            while due < start + duration_s:
                if (delay := due - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                ok = await post_ok(session, url, payload)
                end = time.perf_counter()
                out.add(ok, end - due)
                ends.append(end)
                due += period

        await asyncio.gather(*(pacer(c) for c in range(connections)))
        out.wall_s = max(ends) - start
        out.charge(cpu0, cpu_split(pids))
    return out


async def closed_ttft(
    url: str, body: dict[str, Any], connections: int, duration_s: float, pids: Sequence[int] = ()
) -> Samples:
    """`connections` streaming users in a closed loop; a sample is one stream's TTFT."""
    out = Samples()
    async with client_session(connections) as session:
        await asyncio.gather(
            *(stream_completion(session, url, body, Result(u, 0, time.perf_counter()))
              for u in range(connections))
        )  # fmt: skip
        cpu0 = cpu_split(pids)
        start = time.perf_counter()
        deadline = start + duration_s

        async def user(u: int) -> None:
            i = 0
            while time.perf_counter() < deadline:
                i += 1
                r = await stream_completion(session, url, body, Result(u, i, time.perf_counter()))
                out.add(r.ok and r.ttft is not None, r.ttft or 0.0)

        await asyncio.gather(*(user(u) for u in range(connections)))
        out.wall_s = time.perf_counter() - start
        out.charge(cpu0, cpu_split(pids))
    return out


async def count_events(url: str, body: dict[str, Any]) -> int:
    """The `data:` events of one streamed response (text chunks, finish, `[DONE]`)."""
    async with client_session(1) as session, session.post(url, json=body) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {text[:200]}")
    return sum(1 for line in text.splitlines() if line.startswith("data:"))


def wrk_script(body: dict[str, Any]) -> str:
    # A Lua long string needs no escaping of the JSON inside it.
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = [==[{json.dumps(body)}]==]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )


def parse_wrk(output: str) -> tuple[float, int, int]:
    """(requests/s, requests, errors) from wrk's report; errors = non-2xx + socket errors."""
    rps = re.search(r"Requests/sec:\s*([\d.]+)", output)
    if rps is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{output}")
    total = re.search(r"(\d+) requests in", output)
    errors = 0
    if m := re.search(r"Non-2xx or 3xx responses:\s*(\d+)", output):
        errors += int(m.group(1))
    if m := re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    ):
        errors += sum(int(g) for g in m.groups())
    return float(rps.group(1)), int(total.group(1)) if total else 0, errors


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    server_pids: Callable[[], list[int]]  # where the serving happens, for CPU accounting
    source: str | None = None  # gateways: the folder their code was imported from
    log: Path | None = None  # gateways: what they logged, quoted when requests failed
