"""py-spy (sampling, 400 Hz, idle samples left out) of `tiergate serve` in front of one `instant`
simulator under `bench peers`' paced cell: 64 connections, 400 small requests a second in all,
20 s; the samples written to OUT (py-spy's raw format). From the repository's root, with py-spy
installed in the environment:

    python docs/results/paced-profile/spy.py OUT
    python docs/results/paced-profile/aggregate.py OUT 40
"""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, os.getcwd())
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import paced_small, small_body
from loadtests.instructions import config

MODEL = "meta-llama/Llama-2-7b-chat-hf"
out = sys.argv[1]
with tempfile.TemporaryDirectory() as tmp, SimProcess(profile="instant") as sim:
    cfg = config([sim.url], MODEL)
    cfg.pop("monitor")  # the default scrapes, as `tiergate serve` runs
    path = Path(tmp) / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with GatewayProcess(config=path, log=Path(tmp) / "gw.log") as gw:
        payload = json.dumps(small_body(MODEL)).encode()
        spy = subprocess.Popen(
            [os.path.dirname(sys.executable) + "/py-spy", "record", "--pid", str(gw.pid),
             "--rate", "400", "--format", "raw", "-o", out, "--duration", "20", "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1)
        s = asyncio.run(paced_small(gw.url + "/v1/completions", payload, 64, 400, 20, [gw.pid]))
        print("gateway CPU ms per request", 1000 * s.cpu_s / max(1, len(s.values)))
        spy.wait()
