"""The gateway's CPU while idle (no requests), in front of N idle `instant` simulators, its
monitor scraping each of them 4 times a second (the defaults). From the repository's root:

    python docs/results/relay-inspection/idle.py N
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path.cwd()))
from loadtests.harness.procs import GatewayProcess, SimProcess, cpu_seconds

MODEL = "meta-llama/Llama-2-7b-chat-hf"


def main(n: int) -> None:
    work = Path(tempfile.mkdtemp())
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(SimProcess(profile="instant")) for _ in range(n)]
        backends = [{"url": s.url, "models": [MODEL]} for s in sims]
        cfg = {"tiers": [{"name": "pool", "role": "throughput", "backends": backends}],
               "log_level": "warning"}  # fmt: skip
        (work / "gw.yaml").write_text(yaml.safe_dump(cfg))
        with GatewayProcess(config=work / "gw.yaml", log=work / "gw.log") as gw:
            time.sleep(3)  # past its start
            c0, t0 = cpu_seconds(gw.pid), time.monotonic()
            time.sleep(20)
            ms = 1000 * (cpu_seconds(gw.pid) - c0) / (time.monotonic() - t0)
            print(f"{n} backends: gateway idle {ms:.1f} ms/s")


if __name__ == "__main__":
    main(int(sys.argv[1]))
