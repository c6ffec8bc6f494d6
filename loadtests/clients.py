"""`tiergate bench clients`: httpx, aiohttp and the gateway's own HTTP/1.1 client
(gateway.core.http1) as upstream HTTP clients, the measurement behind the gateway's choice of client
for its calls to the engines.

The same N small requests (`/v1/completions`, 4 tokens) go to one `instant` simulator (no model
time) at a fixed concurrency over pooled keep-alive connections, with `httpx.AsyncClient`,
`aiohttp.ClientSession` and `gateway.core.http1.Http1Pool` in turn, over rounds (the order rotating)
so that drift on the machine falls on each. Reported per library: requests/s and the client's
CPU seconds per 1000 requests (`time.process_time` of this process, which is what a gateway
worker spends per proxied request on its upstream side).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import aiohttp
import httpx
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from engines.sim.profile import load_profile
from gateway.core.http1 import Http1Pool
from loadtests.common.options import setup_logging
from loadtests.common.report import bars, markdown_table
from loadtests.common.stats import rotation
from loadtests.harness.client import event_loop_runner
from loadtests.harness.procs import SimProcess
from loadtests.harness.proxied import JSON_HEADERS, PROFILE, post_ok, small_body

LIBRARIES = ("httpx", "aiohttp", "http1")


@dataclass(frozen=True)
class ClientRun:
    library: str
    requests: int
    errors: int
    wall_s: float
    cpu_s: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else math.nan


@dataclass(frozen=True)
class ClientStat:
    library: str
    runs: list[ClientRun]

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.runs)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.runs)

    @property
    def requests_per_s(self) -> float:
        """Pooled over rounds: all requests over all measured time."""
        wall = sum(r.wall_s for r in self.runs)
        return self.requests / wall if wall > 0 else math.nan

    @property
    def cpu_s_per_1000(self) -> float:
        n = self.requests
        return sum(r.cpu_s for r in self.runs) / n * 1000 if n else math.nan


async def _drive(
    send: Callable[[], Awaitable[bool]], library: str, requests: int, concurrency: int
) -> ClientRun:
    """Warm the pool (one request per connection), then time `requests` requests from
    `concurrency` workers pulling from one counter."""
    await asyncio.gather(*(send() for _ in range(concurrency)))
    left, errors = requests, 0

    async def worker() -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            if not await send():
                errors += 1

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return ClientRun(library, requests, errors, wall, cpu)


async def with_aiohttp(url: str, payload: bytes, requests: int, concurrency: int) -> ClientRun:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return await _drive(lambda: post_ok(session, url, payload), "aiohttp", requests,
                            concurrency)  # fmt: skip


async def with_httpx(url: str, payload: bytes, requests: int, concurrency: int) -> ClientRun:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def send() -> bool:
            try:
                resp = await client.post(url, content=payload, headers=JSON_HEADERS)
                return resp.status_code == 200
            except httpx.HTTPError:
                return False

        return await _drive(send, "httpx", requests, concurrency)


async def with_http1(url: str, payload: bytes, requests: int, concurrency: int) -> ClientRun:
    base, _, path = url.partition("/v1/")
    pool = Http1Pool(connect_timeout_s=5, read_timeout_s=30, keepalive_s=30)
    headers = {"content-type": "application/json"}

    async def send() -> bool:
        try:
            resp = await pool.post(base, "/v1/" + path, payload, headers)
            await resp.read()
            resp.release()
            return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    try:
        return await _drive(send, "http1", requests, concurrency)
    finally:
        await pool.aclose()


_CLIENTS = {"httpx": with_httpx, "aiohttp": with_aiohttp, "http1": with_http1}


async def _measure(
    url: str, requests: int, concurrency: int, rounds: int, progress: Progress
) -> dict[str, ClientStat]:
    payload = json.dumps(small_body(load_profile(PROFILE).model)).encode()
    runs: dict[str, list[ClientRun]] = {lib: [] for lib in LIBRARIES}
    task = progress.add_task("clients", total=rounds * len(LIBRARIES))
    for r in range(rounds):
        for lib in rotation(LIBRARIES, r):
            progress.update(task, description=f"round {r + 1}/{rounds}  {lib}")
            runs[lib].append(await _CLIENTS[lib](url, payload, requests, concurrency))
            progress.advance(task)
    return {lib: ClientStat(lib, rs) for lib, rs in runs.items()}


def rows(stats: dict[str, ClientStat]) -> tuple[list[str], list[list[str]]]:
    head = ["library", "requests", "errors", "req/s (pooled)", "req/s per round",
            "client CPU s / 1000 req"]  # fmt: skip
    body = [
        [
            s.library,
            f"{s.requests:,}",
            str(s.errors),
            f"{s.requests_per_s:,.0f}",
            " / ".join(f"{r.requests_per_s:,.0f}" for r in s.runs),
            f"{s.cpu_s_per_1000:.3f}",
        ]
        for s in stats.values()
    ]
    return head, body


def ratio_line(stats: dict[str, ClientStat]) -> str:
    a, h, g = stats["aiohttp"], stats["httpx"], stats["http1"]
    return (
        f"aiohttp / httpx: {a.requests_per_s / h.requests_per_s:.2f}x the requests/s, "
        f"{a.cpu_s_per_1000 / h.cpu_s_per_1000:.2f}x the client CPU per request; "
        f"http1 / aiohttp: {g.requests_per_s / a.requests_per_s:.2f}x the requests/s, "
        f"{g.cpu_s_per_1000 / a.cpu_s_per_1000:.2f}x the client CPU per request"
    )


def run(
    requests: int = 3000,
    concurrency: int = 64,
    rounds: int = 3,
    out: Path | None = Path("docs/results/clients.md"),
    console: Console | None = None,
    command: str | None = None,
) -> dict[str, ClientStat]:
    console = console or Console()
    command = command or shlex.join(["tiergate", *sys.argv[1:]])
    with contextlib.ExitStack() as stack:
        with console.status("starting the simulator..."):
            sim = stack.enter_context(SimProcess(profile=PROFILE))
        progress = stack.enter_context(bars(console))
        runner = stack.enter_context(event_loop_runner())
        url = sim.url + "/v1/completions"
        stats = runner.run(_measure(url, requests, concurrency, rounds, progress))
    head, body = rows(stats)
    table = Table(title=f"Upstream HTTP clients: {requests} requests x {rounds} rounds, "
                  f"concurrency {concurrency}")  # fmt: skip
    for h in head:
        table.add_column(h, justify="left" if h == "library" else "right")
    for row in body:
        table.add_row(*row)
    console.print(table)
    line = ratio_line(stats)
    console.print(line)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        date = datetime.now(UTC).isoformat(timespec="seconds")
        text = "\n".join([
            "# Upstream HTTP client: httpx vs aiohttp", "",
            f"- Command: `{command}`", f"- Date: {date}", f"- Machine: `nproc` = {os.cpu_count()}",
            f"- Workload: {requests} small non-streamed `/v1/completions` requests per library "
            f"per round, concurrency {concurrency}, {rounds} rounds alternating the libraries, "
            f"against one `{PROFILE}` simulator on loopback; CPU = `time.process_time()` of "
            "the client process during the timed part (after a warm-up request per connection).",
            "", markdown_table(head, body), "", line, "",
        ])  # fmt: skip
        out.write_text(text)
        console.print(f"wrote {out}")
    return stats


# -- the command ------------------------------------------------------------------------------


def command(
    requests: Annotated[int, typer.Option(min=1, help="Requests per library per round.")] = 3000,
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrent requests.")] = 64,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (libraries alternating).")] = 3,
    out: Annotated[Path, typer.Option(help="Markdown summary.")] = Path("docs/results/clients.md"),
) -> None:
    """httpx against aiohttp as the upstream client: requests/s and client CPU per request, on
    the same small requests to an instant simulator (why the gateway uses aiohttp)."""

    setup_logging("warning")
    run(requests=requests, concurrency=concurrency, rounds=rounds, out=out)
