"""The gateway's CPU while no request comes: `tiergate serve` with `tiergate bench peers`'
configuration (the defaults: each engine's /metrics scraped every 0.25 s, health every 2 s) in
front of one `instant` simulator, its process's user + system time over 20 s, after 5 s.
With the bench's instructions configuration (scraping off), and vLLM's router as `bench peers`
starts it (the simulator its one worker, round robin; its process tree), for comparison.

Usage (from the repository root): python docs/results/instructions-header-lines/idle.py"""

import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from engines.sim.profile import load_profile
from loadtests import instructions as bench
from loadtests.harness.peerenv import PEERS, PeerProcess, default_venv, process_tree
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import gateway_config

SECONDS = 20.0


def cpu(pid: int) -> float:
    """User + system CPU seconds of `pid` and its children alive now."""
    total = 0
    for p in process_tree(pid):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def idle(pid: int) -> float:
    """CPU seconds `pid` uses in SECONDS, 5 s after it answered."""
    time.sleep(5.0)
    before = cpu(pid)
    time.sleep(SECONDS)
    return cpu(pid) - before


def show(name: str, used: float) -> None:
    print(f"{name}: {used / SECONDS * 1000:.1f} ms of CPU a second "
          f"({used * 1000:.0f} ms in {SECONDS:.0f} s)")  # fmt: skip


model = load_profile(bench.PROFILE).model
with tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    with SimProcess(profile=bench.PROFILE, log=work / "s.log", args=["--model", model]) as sim:
        configs = {
            "defaults (bench peers)": gateway_config(sim.url, model),
            "scraping off (bench instructions)": bench.config([sim.url], model),
        }
        for name, cfg in configs.items():
            (work / "g.yaml").write_text(yaml.safe_dump(cfg))
            gw = GatewayProcess(config=work / "g.yaml", log=work / "g.log")
            gw.start(timeout=120)
            try:
                show(name, idle(gw.pid))
            finally:
                gw.stop()
        peer = PEERS["vllm-router"]
        binary = default_venv() / "bin" / peer.command
        with PeerProcess(peer, binary, [sim.url], model, work) as router:
            assert router.proc is not None
            show("vllm-router (bench peers)", idle(router.proc.pid))
