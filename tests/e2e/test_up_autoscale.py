"""`tiergate up --autoscale`: under a step load (2 closed-loop users, then 24, then 1) the pool
grows as the planner asks and shrinks back when the load falls, every request answered whole;
Ctrl-C stops every simulator, the ones it started too."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadtests.harness.procs import bindable, free_port, wait_http

# Bounds on time and CPU: run after the parallel tests, alone (scripts/test).
pytestmark = [pytest.mark.e2e, pytest.mark.serial]
MODEL = "meta-llama/Llama-2-7b-chat-hf"
BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 32,
                        "ignore_eos": True, "stream": True}  # fmt: skip
MAX = 3  # throughput simulators at most
WAIT_S = 90.0


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_run(n: int, taken: int) -> int:
    """The first of `n` consecutive free ports (the stack's simulators, those added too)."""
    while True:
        p = free_port()
        if taken not in range(p, p + n) and all(bindable(q) for q in range(p, p + n)):
            return p


def pool(gw: str) -> set[str]:
    state = httpx.get(gw + "/state", timeout=10).json()
    return {b["url"] for b in state["backends"] if b["tier"] == "throughput" and not b["left"]}


class Load:
    """Closed-loop users; `users` may change while they run. Connections are kept idle for at
    most 1 s: the gateway closes idle ones after 5 s, and a client that sends on a connection
    the server is closing gets a reset that no server can prevent."""

    def __init__(self, gw: str) -> None:
        self.gw, self.users = gw, 0
        self.answered: list[str] = []  # the backend of each request answered whole
        self.failed: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def user(self, c: httpx.AsyncClient, i: int) -> None:
        while i < self.users:
            try:
                r = await c.post(self.gw + "/v1/completions", json=BODY)
            except httpx.HTTPError as e:
                self.failed.append(repr(e))
                continue
            if r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and (
                    '"error"' not in r.text):  # fmt: skip
                self.answered.append(r.headers["x-tiergate-backend"])
            else:
                self.failed.append(f"{r.status_code} {r.text[-200:]!r}")

    async def step(self, c: httpx.AsyncClient, users: int, until: Any, what: str) -> None:
        """`users` users until `until()` (checked every 0.5 s) holds."""
        old, self.users = self.users, users
        self.tasks += [asyncio.create_task(self.user(c, i)) for i in range(old, users)]
        deadline = time.monotonic() + WAIT_S
        while not await asyncio.to_thread(until):
            assert time.monotonic() < deadline, f"not within {WAIT_S:g} s: {what}"
            await asyncio.sleep(0.5)


def test_the_pool_follows_the_planner_with_no_request_lost(tmp_path: Path) -> None:
    port = free_port()
    sim_port = _free_run(2 + MAX, port)
    env = {**os.environ, "TIERGATE_PLANNER__INTERVAL_S": "0.5", "TIERGATE_PLANNER__TAU_S": "2",
           "TIERGATE_PLANNER__STARTUP_S": "0"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "up", "--autoscale", "--port", str(port),
         "--sim-port", str(sim_port), "--throughput", "1", "--max-replicas", str(MAX),
         "--startup-s", "1", "--scale-down-after-s", "2", "--logs", str(tmp_path),
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    gw = f"http://127.0.0.1:{port}"
    first = f"http://127.0.0.1:{sim_port + 1}"
    try:
        try:
            wait_http(gw + "/ready", timeout=30, proc=proc)
        except RuntimeError:
            said = proc.stdout.read() if proc.stdout else b""
            raise AssertionError(f"tiergate up did not start:\n{said.decode()[-3000:]}") from None
        assert pool(gw) == {first}
        load = Load(gw)

        async def run() -> None:
            limits = httpx.Limits(max_connections=100, keepalive_expiry=1.0)
            async with httpx.AsyncClient(timeout=60, limits=limits) as c:
                await load.step(c, 2, lambda: len(load.answered) >= 10, "a few answers")
                await load.step(c, 24, lambda: len(pool(gw)) >= 2 and bool(
                    set(load.answered) & (pool(gw) - {first})), "a new simulator answering")
                await load.step(c, 1, lambda: pool(gw) == {first} and yaml.safe_load(
                    (tmp_path / "pool.yaml").read_text()) == [first], "the pool back to one")
                load.users = 0
                await asyncio.gather(*load.tasks)

        asyncio.run(run())
        assert load.failed == []
        grown = {u for u in load.answered if u != first}
        assert grown
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert "Traceback" not in text, text[-3000:]
    for p in range(sim_port, sim_port + 2 + MAX):
        assert not _port_open(p), f"a simulator left running on {p}"
