"""Python bytecodes of the gateway's scrape rounds while no request comes: `tiergate serve`
with `tiergate bench peers`' configuration (one `instant` simulator scraped every 0.25 s, the
routing modules compiled where built) under bytecodes.py's counter for 20 s. A round is a call
of `Learner.refresh` (once a round); per round, each file's and the top functions' own
bytecodes, and calls (a coroutine's resumptions count as calls).

Usage (from the repository root):
python docs/results/instructions-header-lines/scrape_bytecodes.py"""

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from engines.sim.profile import load_profile
from loadtests import instructions as bench
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import gateway_config

ROOT = Path(__file__).resolve().parents[3]
SECONDS = 20.0
COUNTER = Path(__file__).with_name("bytecodes.py")


class CountedGateway(GatewayProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-P", str(COUNTER), *self.argv()]


def short(path: str) -> str:
    return path.split("site-packages/")[-1].replace(f"{ROOT}/", "")


model = load_profile(bench.PROFILE).model
with tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    out = work / "bytecodes.json"
    with SimProcess(profile=bench.PROFILE, log=work / "s.log", args=["--model", model]) as sim:
        (work / "g.yaml").write_text(yaml.safe_dump(gateway_config(sim.url, model)))
        env = {"BYTECODES_OUT": str(out), "PYTHONPATH": str(ROOT)}
        gw = CountedGateway(config=work / "g.yaml", log=work / "g.log", env=env)
        gw.start(timeout=120)
        try:
            time.sleep(3.0)
            os.kill(gw.pid, signal.SIGUSR1)
            time.sleep(SECONDS)
            os.kill(gw.pid, signal.SIGUSR2)
            while not out.exists() or not out.read_text().endswith("}"):
                time.sleep(0.1)
        finally:
            gw.stop()
    data = json.loads(out.read_text())
own = {(short(f), line, name): n for f, line, name, n in data["own"]}
calls = {(short(f), line, name): n for f, line, name, n in data["calls"]}
rounds = sum(n for (f, _, name), n in calls.items() if name == "refresh" and "learner" in f)
total = sum(own.values())
each = sum(calls.values()) / rounds
print(f"{SECONDS:.0f} s, {rounds} scrape rounds: {total / SECONDS:,.0f} bytecodes a second, "
      f"{total / rounds:,.0f} a round, {each:,.0f} calls a round")  # fmt: skip
files: dict[str, int] = {}
for (f, _, _), n in own.items():
    files[f] = files.get(f, 0) + n
print("\nper round, by file:")
for f, n in sorted(files.items(), key=lambda kv: -kv[1])[:20]:
    print(f"{n / rounds:8,.0f}  {f}")
print("\nper round, by function (own bytecodes, calls):")
for k, n in sorted(own.items(), key=lambda kv: -kv[1])[:25]:
    print(f"{n / rounds:8,.0f} {calls.get(k, 0) / rounds:6.2f}  {k[0]}:{k[1]} {k[2]}")
