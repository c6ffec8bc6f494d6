"""CPU per request of the gateway against the least a Python relay does (relay.py), and against
the gateway with its request path compiled by mypyc (build.py), and against vLLM's router (from
the peers' environment `tiergate bench peers` installs), in rotating order, in front of one
`instant` simulator: per paced small request (64 connections, 400 req/s in all, as `bench
peers`' paced cell) and per 64-token stream under `wrk -t2 -c64` (no usage asked, as `bench
peers`' SSE cell). From the repository's root:

    python docs/results/request-path-floors/floors.py ROUNDS [COMPILED_TREE]

Each line: round, target, what, requests, CPU ms per request (user + system of the target's
processes over the window, /proc), user and system apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import yaml

sys.path.insert(0, str(Path.cwd()))
from loadtests.harness.peerenv import PeerProcess, default_venv, ensure
from loadtests.harness.procs import GatewayProcess, SimProcess, free_port, wait_http
from loadtests.harness.proxied import (
    gateway_config,
    paced_small,
    small_body,
    stream_body,
    wrk_script,
)

MODEL = "meta-llama/Llama-2-7b-chat-hf"
HERE = Path(__file__).resolve().parent


Pids = Callable[[], list[int]]


def cpu(pids: Pids) -> tuple[float, float]:
    """User and system seconds of the processes so far."""
    user = system = 0.0
    for pid in pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        tick = os.sysconf("SC_CLK_TCK")
        user, system = user + int(fields[11]) / tick, system + int(fields[12]) / tick
    return user, system


@dataclass
class Tree(GatewayProcess):
    """The gateway of the tree at `root` (this one's when empty)."""

    root: str = ""

    def command(self) -> list[str]:
        cmd = super().command()
        return ["env", "-C", self.root, *cmd] if self.root else cmd


@contextmanager
def gateway(work: Path, sim: SimProcess, root: str) -> Iterator[tuple[str, Pids]]:
    cfg = work / "gw.yaml"
    cfg.write_text(yaml.safe_dump(gateway_config(sim.url, MODEL)))
    gw = Tree(config=cfg, log=work / "gw.log", env={"PYTHONPATH": root} if root else None,
              root=root)  # fmt: skip
    with gw:
        yield gw.url, lambda: [gw.pid]


@contextmanager
def relay(work: Path, sim: SimProcess) -> Iterator[tuple[str, Pids]]:
    port = free_port()
    cmd = [sys.executable, str(HERE / "relay.py"), sim.host, str(sim.port), str(port)]
    with open(work / "relay.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 20, proc)
        yield f"http://127.0.0.1:{port}", lambda: [proc.pid]
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def router(work: Path, sim: SimProcess) -> Iterator[tuple[str, Pids]]:
    """vLLM's router (round_robin) from the peers' environment (`tiergate bench peers`
    installs it there)."""
    installed = ensure(["vllm-router"], default_venv(), False)["vllm-router"]
    assert installed.binary is not None, installed.note
    peer = PeerProcess(installed.peer, installed.binary, [sim.url], MODEL, work, "round_robin")
    try:
        peer.spawn().wait_ready()
        yield peer.url, peer.pids
    finally:
        peer.stop()


def measure(name: str, r: int, url: str, pids: Pids, work: Path) -> None:
    payload = json.dumps(small_body(MODEL)).encode()
    u0, s0 = cpu(pids)
    out = asyncio.run(paced_small(url + "/v1/completions", payload, 64, 400.0, 5.0))
    (u1, s1), n = cpu(pids), len(out.values) + out.errors
    print(f"round {r} {name:16s} paced small  n={n} errors={out.errors} cpu "
          f"{1000 * (u1 + s1 - u0 - s0) / n:.3f} (user {1000 * (u1 - u0) / n:.3f} sys "
          f"{1000 * (s1 - s0) / n:.3f})", flush=True)  # fmt: skip
    lua = work / "s.lua"
    lua.write_text(wrk_script(stream_body(MODEL, 64, usage=False)))
    wrk = ["wrk", "-t2", "-c64", "--timeout=30s", "-s", str(lua), url + "/v1/completions"]
    subprocess.run([*wrk, "-d1s"], capture_output=True, check=True)
    u0, s0 = cpu(pids)
    text = subprocess.run([*wrk, "-d5s"], capture_output=True, text=True, check=True).stdout
    (u1, s1) = cpu(pids)
    n = int(next(x for x in text.splitlines() if "requests in" in x).split()[0])
    bad = [x.strip() for x in text.splitlines() if "Non-2xx" in x or "Socket errors" in x]
    print(f"round {r} {name:16s} wrk stream   n={n} {' '.join(bad)} cpu "
          f"{1000 * (u1 + s1 - u0 - s0) / n:.3f} (user {1000 * (u1 - u0) / n:.3f} sys "
          f"{1000 * (s1 - s0) / n:.3f})", flush=True)  # fmt: skip


def main(rounds: int, compiled: str) -> None:
    with TemporaryDirectory() as tmp:
        work = Path(tmp)
        with SimProcess(profile="instant", log=work / "sim.log") as sim:
            targets: list[tuple[str, Callable[[], AbstractContextManager[tuple[str, Pids]]]]]
            targets = [("tiergate", lambda: gateway(work, sim, "")),
                       ("relay", lambda: relay(work, sim)),
                       ("vllm-router", lambda: router(work, sim))]  # fmt: skip
            if compiled:
                targets.insert(1, ("tiergate-compiled", lambda: gateway(work, sim, compiled)))
            for r in range(rounds):
                k = r % len(targets)
                for name, start in targets[k:] + targets[:k]:
                    with start() as (url, pids):
                        measure(name, r, url, pids, work)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
