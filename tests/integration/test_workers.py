"""`tiergate serve --workers 2` over real sockets, in front of a latency and a throughput
simulator: one port, both workers serving, the latency tier's hard cap held across them (as
the engine itself counts its requests), a drain on SIGTERM, and nothing left behind: no
process, no shared-memory file, whether the parent is signalled or killed."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import load_settings
from gateway.routing import Decision, RouteRequest
from gateway.serve.app import COMPLETIONS, Proxy
from gateway.serve.assembly import Hosting, open_gateway
from loadtests.harness.procs import GatewayProcess
from tests.conftest import free_port
from tests.integration.stack import (
    MODEL,
    Stack,
    add_gateway,
    start_stack,
    wait_until,
    wait_until_async,
)

CAP = 4
# The latency tier takes work up to CAP and never past it; everything else overflows.
POLICY = {"name": "golden-range", "latency_max_concurrency": CAP, "hysteresis": 1,
          "latency_hard_cap": CAP}  # fmt: skip
STREAMS = 64


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("workers"), latency=1, throughput=1, speedup=10,
                    gateways=0)  # fmt: skip
    yield s
    s.stop()


def gateway(stack: Stack, workdir: Path) -> GatewayProcess:
    gw = add_gateway(stack, workdir, f"gateway-{len(stack.gateways)}", workers=2, policy=POLICY)
    workers(gw)  # both serve
    return gw


def workers(gw: GatewayProcess, timeout: float = 30.0) -> dict[int, tuple[int, float]]:
    """{pid: (requests it served, requests /metrics counts)} for both workers, each reached on
    a connection of its own (the kernel picks the worker per connection): /state says which
    and how many it served, /metrics how many the whole gateway did."""
    seen: dict[int, tuple[int, float]] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < 2:
        assert time.monotonic() < deadline, f"only workers {sorted(seen)} answered"
        with httpx.Client(base_url=gw.url, timeout=5) as client:  # one kept-alive connection
            state = client.get("/state").json()
            metrics = client.get("/metrics").text
        seen[state["pid"]] = (state["served"], requests_counted(metrics))
        time.sleep(0.05)
    return seen


def requests_counted(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("tiergate_requests_total{"))  # fmt: skip


def metrics_dirs(parent: int) -> list[str]:
    return glob.glob(f"/dev/shm/tiergate-metrics-{parent}-*")


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"}


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def shm_files(parent: int) -> list[str]:
    return glob.glob(f"/dev/shm/tiergate-{parent}-*")


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}  # fmt: skip


async def stream(session: aiohttp.ClientSession, url: str, max_tokens: int) -> list[str]:
    async with session.post(url + "/v1/completions", json=body(max_tokens)) as r:
        assert r.status == 200, await r.text()
        return [line[6:].decode().strip() async for line in r.content
                if line.startswith(b"data: ")]  # fmt: skip


async def load(url: str, requests_per_stream: int) -> int:
    """STREAMS closed-loop streams on connections of their own; how many completed."""
    connector = aiohttp.TCPConnector(limit=STREAMS)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> int:
            for _ in range(requests_per_stream):
                events = await stream(session, url, 16)
                assert events[-1] == "[DONE]"
            return requests_per_stream

        return sum(await asyncio.gather(*(one() for _ in range(STREAMS))))


def test_two_workers_share_the_port_and_hold_the_cap(stack: Stack, tmp_path: Path) -> None:
    gw = gateway(stack, tmp_path)
    done = asyncio.run(load(gw.url, 5))
    assert done == STREAMS * 5
    served = workers(gw)
    assert all(mine > 0 for mine, _ in served.values()), served
    assert sum(mine for mine, _ in served.values()) == done
    # Either worker's /metrics counts the whole gateway's requests, and its gauges sum theirs.
    assert all(counted == done for _, counted in served.values()), served
    assert len(metrics_dirs(gw.pid)) == 1
    # As the latency engine counted its requests: the cap reached, and never passed.
    seen = httpx.get(stack.latency[0].url + "/sim/concurrency").json()
    assert seen["peak"] == CAP, seen

    # SIGTERM drains both: streams in flight on each worker run to their end.
    processes = descendants(gw.pid)

    async def in_flight_then_term() -> list[list[str]]:
        clients = []
        per_worker: dict[int, int] = {}
        while len(clients) < 4:  # two streams per worker, each on a connection of its own
            client = httpx.AsyncClient(base_url=gw.url, timeout=60)
            pid = (await client.get("/state")).json()["pid"]
            if per_worker.get(pid, 0) == 2:
                await client.aclose()
                continue
            per_worker[pid] = per_worker.get(pid, 0) + 1
            clients.append(client)
        answered = 0

        async def read(client: httpx.AsyncClient) -> list[str]:
            nonlocal answered
            pin = {"x-tiergate-tier": "throughput"}
            try:
                async with client.stream("POST", "/v1/completions", json=body(400),
                                         headers=pin) as r:  # fmt: skip
                    assert r.status_code == 200
                    answered += 1
                    return [line[6:] async for line in r.aiter_lines()
                            if line.startswith("data: ")]  # fmt: skip
            finally:
                await client.aclose()

        streams = asyncio.gather(*(read(c) for c in clients))
        # In flight: every stream answered (a failed one ends the wait; `streams` raises it).
        await wait_until_async(lambda: answered == len(clients) or streams.done(),
                               "all four streams answered")  # fmt: skip
        gw.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        return await streams

    for events in asyncio.run(in_flight_then_term()):
        assert events[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
        assert text  # whole: no error event (the simulator's text has no fixed length)
        assert not any('"error"' in e for e in events)
    assert gw.proc.wait(30) == 0  # type: ignore[union-attr]
    wait_until(lambda: not alive(processes), f"no process left behind of {processes}", 10)
    assert shm_files(gw.pid) == []
    assert metrics_dirs(gw.pid) == []


def test_a_dead_worker_is_replaced_and_none_outlives_a_killed_parent(
    stack: Stack, tmp_path: Path
) -> None:
    gw = gateway(stack, tmp_path)
    assert len(shm_files(gw.pid)) == 1
    for _ in range(20):  # a connection each: both workers serve some
        r = httpx.post(gw.url + "/v1/completions", json={**body(4), "stream": False}, timeout=10)
        assert r.status_code == 200
    before = workers(gw)
    assert {counted for _, counted in before.values()} == {20}
    assert all(mine > 0 for mine, _ in before.values()), before
    first = set(before)
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    after = workers(gw)  # both answering again: the survivor and a replacement
    now = set(after)
    assert victim not in now
    assert first - {victim} <= now
    # The dead worker's counts stay in the gateway's totals.
    assert {counted for _, counted in after.values()} == {counted for _, counted in before.values()}

    processes = descendants(gw.pid)
    gw.proc.kill()  # type: ignore[union-attr]
    gw.proc.wait(5)  # type: ignore[union-attr]
    # The workers see their parent gone, drain (nothing in flight) and exit, and one of them
    # removes the shared-memory file the parent could not.
    wait_until(lambda: not alive(processes), f"no process left behind of {processes}", 15)
    assert shm_files(gw.pid) == []
    assert metrics_dirs(gw.pid) == []


async def test_a_slot_another_worker_took_sends_the_request_back_to_admission() -> None:
    """In process: the decision sees the latency backend's last slot free, another worker
    takes it before the lease; the attempt does not go (nobody listens there: it would fail),
    admission decides again, finds the tier saturated, and (no queueing) answers 429."""
    url = f"http://127.0.0.1:{free_port()}"
    tier = {"name": "eagle", "role": "latency", "backends": [{"url": url, "models": ["m"]}]}
    settings = load_settings(None, tiers=[tier], workers=2, policy={
        "name": "golden-range", "latency_max_concurrency": 1, "hysteresis": 0,
        "latency_hard_cap": 1, "queue_deadline_s": 0})  # fmt: skip
    store = MemoryInflightStore()  # the workers' shared counts, as far as this test goes
    async with open_gateway(settings, Hosting(store=store)) as gw:
        decide = gw.admission.decide
        decisions: list[str] = []

        def racing(req: RouteRequest) -> Decision:
            decision = decide(req)
            decisions.append(decision.reason)
            if len(decisions) == 1:
                store.acquire(url)  # the other worker, between this decision and its lease
            return decision

        gw.admission.decide = racing
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b'{"model": "m", "prompt": "hi"}'}

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "headers": [], "state": {"gateway": gw}}
        await Proxy(COMPLETIONS)(scope, receive, send)
        entry = gw.registry.entry(url)
        assert sent[0]["status"] == 429
        assert decisions == ["golden_range", "saturated"], decisions
        assert (entry.outlier.failed_now, entry.outlier.consecutive) == (0, 0)
        assert store.counts() == {url: 1}  # the other worker's; none of ours left
