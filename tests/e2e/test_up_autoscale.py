"""`tiergate up --autoscale` under a Locust step load (loadtests/locust/scenarios/step.py: 2
users, then 24, then 1): the pool grows as the planner asks and shrinks back when the load
falls, every request answered whole; Ctrl-C stops every simulator, the ones it started too."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from loadtests.harness.procs import free_port, free_ports, wait_http

# Bounds on time and CPU: run after the parallel tests, alone (scripts/test).
pytestmark = [pytest.mark.e2e, pytest.mark.serial]
ROOT = Path(__file__).resolve().parents[2]
MAX = 3  # throughput simulators at most
# Locust's phases, PHASE_S each: the pool has the 24 users' to grow and a new simulator to
# answer, the last user's to shrink back (waited for after it, too: the load is bound in time,
# the planner's reaction is not).
STEPS = (2, 24, 24, 24, 1)
PHASE_S = 6
WAIT_S = 90.0


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def pool(gw: str) -> set[str]:
    state = httpx.get(gw + "/state", timeout=10).json()
    return {b["url"] for b in state["backends"] if b["tier"] == "throughput" and not b["left"]}


def test_the_pool_follows_the_planner_with_no_request_lost(tmp_path: Path) -> None:
    port = free_port()
    sim_port = free_ports(2 + MAX, avoid=(port,))  # the stack's simulators, those added too
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
        jsonl, log = tmp_path / "locust.jsonl", (tmp_path / "locust.log").open("w")
        locust = subprocess.Popen(
            [sys.executable, "-m", "locust", "--headless", "-f",
             "loadtests/locust/scenarios/step.py", "--steps", ",".join(map(str, STEPS)),
             "--phase-seconds", str(PHASE_S), "-H", gw, "--prompt-tokens", "3",
             "--output-tokens", "32", "--jsonl", str(jsonl), "--run-label", "autoscale",
             # a user leaving at a step finishes its request first: none is cut by the client
             "--stop-timeout", "60", "--loglevel", "WARNING", "--only-summary"],
            # a file, not a pipe: nothing reads a pipe while Locust runs, and a full one blocks it
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        seen: list[set[str]] = []  # the pool at each look while Locust runs
        try:
            deadline = time.monotonic() + len(STEPS) * PHASE_S + WAIT_S
            while locust.poll() is None:
                assert time.monotonic() < deadline, "Locust did not end"
                seen.append(pool(gw))
                time.sleep(0.5)
        finally:
            if locust.poll() is None:
                locust.kill()
            locust.wait()
            log.close()
        assert locust.returncode == 0, (tmp_path / "locust.log").read_text()[-3000:]
        records = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
        failed = [r for r in records if not r["ok"] or r["output_tokens"] != 32]
        assert failed == [], failed[:5]
        assert {r["users"] for r in records} == set(STEPS)
        assert max(len(p) for p in seen) >= 2, "the pool never grew"
        grown = {r["backend"] for r in records} - {first}
        assert grown, "no request answered by a simulator the planner added"
        # Back to one, with no load or the last user's: waited for, bounded.
        deadline = time.monotonic() + WAIT_S
        while not (pool(gw) == {first} and yaml.safe_load(
                (tmp_path / "pool.yaml").read_text()) == [first]):  # fmt: skip
            assert time.monotonic() < deadline, f"the pool not back to one: {pool(gw)}"
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert "Traceback" not in text, text[-3000:]
    for p in range(sim_port, sim_port + 2 + MAX):
        assert not _port_open(p), f"a simulator left running on {p}"
