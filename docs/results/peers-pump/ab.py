"""The gateway's CPU per 64-token stream under `wrk -t2 -c64`, this tree against another one
(ab.txt): `python ab.py /path/to/other/tree` from the repository's root, each run printing one
line; run it alternately for both trees (ROOT unset: this tree). The gateway's process CPU
(user + system, psutil) over the wrk run divided by the streams wrk completed, and its read and
write system calls per stream (/proc/PID/io), in front of one `instant` simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path.cwd()))
from engines.sim.profile import load_profile
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import stream_body
from loadtests.instructions import config
from loadtests.peers import wrk_script

ROOT = os.environ.get("ROOT")


class Other(GatewayProcess):
    """The gateway of the tree at ROOT (this tree's when unset)."""

    def command(self) -> list[str]:
        cmd = super().command()
        return cmd if not ROOT else ["env", "-C", ROOT, *cmd]


def io(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def main(work: Path) -> None:
    model = load_profile("instant").model
    with SimProcess(profile="instant", log=work / "sim.log", args=["--model", model]) as sim:
        cfg = config([sim.url], model) | {"monitor": {"scrape_interval_s": 1.0,
                                                      "probe_interval_s": 1.0}}  # fmt: skip
        (work / "gw.yaml").write_text(yaml.safe_dump(cfg))
        gw = Other(config=work / "gw.yaml", log=work / "gw.log",
                   env={"PYTHONPATH": ROOT} if ROOT else None)  # fmt: skip
        gw.start(timeout=300)
        try:
            lua = work / "s.lua"
            lua.write_text(wrk_script(stream_body(model, 64, usage=False)))
            url = f"http://{gw.host}:{gw.port}/v1/completions"
            wrk = ["wrk", "-t2", "-c64", "--timeout=30s", "-s", str(lua), url]
            subprocess.run([*wrk, "-d2s"], capture_output=True, check=True)  # warm up
            proc = psutil.Process(gw.pid)
            a, ta = io(gw.pid), proc.cpu_times()
            out = subprocess.run([*wrk, "-d5s"], capture_output=True, text=True, check=True)
            b, tb = io(gw.pid), proc.cpu_times()
            n = int(next(x for x in out.stdout.splitlines() if "requests in" in x).split()[0])
            user, system = (tb.user - ta.user) * 1000 / n, (tb.system - ta.system) * 1000 / n
            print(f"{'base' if ROOT else 'tree'} stream: {n} requests, cpu ms/req "
                  f"{user + system:.3f} (user {user:.3f} sys {system:.3f}); reads/req "
                  f"{(b['syscr'] - a['syscr']) / n:.1f} writes/req "
                  f"{(b['syscw'] - a['syscw']) / n:.1f}")  # fmt: skip
        finally:
            gw.stop()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        main(Path(tmp))
