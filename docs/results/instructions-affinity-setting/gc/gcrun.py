"""The garbage collector's passes in a gateway (two `instant` simulators, `policy.prefix_affinity`
on or off) over 2,000 one-off 64-token streams, after 1,150 one-off small requests (the memory
of homes quiet): OUT.1 at the end of the small requests, OUT.2 at the end of the streams.
From the repository's root:

    python docs/results/instructions-affinity-setting/gc/gcrun.py OUT on|off 2000
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import yaml

sys.path.insert(0, str(Path.cwd()))
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import small_body, stream_body
from loadtests.instructions import config

MODEL = "meta-llama/Llama-2-7b-chat-hf"
SERIAL = itertools.count()
HERE = Path(__file__).resolve().parent


def post(conn: http.client.HTTPConnection, body: dict[str, Any]) -> None:
    data = json.dumps(body | {"prompt": f"{body['prompt']} {next(SERIAL):08d}"}).encode()
    conn.request("POST", "/v1/completions", body=data,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    r = conn.getresponse()
    r.read()
    assert r.status == 200


def main(out: str, affinity: bool, streams: int) -> None:
    with TemporaryDirectory() as tmp, SimProcess(profile="instant") as a, \
            SimProcess(profile="instant") as b:  # fmt: skip
        cfg = Path(tmp) / "gw.yaml"
        c = config([a.url, b.url], MODEL)
        c.setdefault("policy", {})["prefix_affinity"] = affinity
        cfg.write_text(yaml.safe_dump(c))
        env = {"PYTHONPATH": f"{HERE}:{Path.cwd()}", "GCPROBE_OUT": out}
        gw = GatewayProcess(config=cfg, log=Path(tmp) / "gw.log", env=env)
        gw.start(60)
        try:
            conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
            for _ in range(1150):
                post(conn, small_body(MODEL))
            os.kill(gw.pid, signal.SIGUSR2)
            time.sleep(0.5)
            for _ in range(streams):
                post(conn, stream_body(MODEL, 64, usage=False))
            os.kill(gw.pid, signal.SIGUSR2)
            time.sleep(0.5)
            conn.close()
        finally:
            gw.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "on", int(sys.argv[3]))
