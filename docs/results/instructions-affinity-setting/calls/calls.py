"""Python's call counts (cProfile) in a gateway in front of two `instant` simulators,
`policy.prefix_affinity` on or off: 1,100 one-off small requests, then N one-off 64-token
streams; the profile written to OUT when the gateway stops. From the repository's root:

    python docs/results/instructions-affinity-setting/calls/calls.py OUT on|off N

Four runs (on and off, N = 0 and 400) give per stream, by compare.py, the calls that affinity
adds: (on, 400) - (on, 0) against (off, 400) - (off, 0).
"""

from __future__ import annotations

import http.client
import itertools
import json
import sys
import time
from dataclasses import dataclass
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


@dataclass
class ProfiledGateway(GatewayProcess):
    out: Path = Path("gateway.prof")

    def command(self) -> list[str]:
        return [sys.executable, "-P", "-m", "cProfile", "-o", str(self.out), "-m", "tiergate",
                *self.argv()]  # fmt: skip


def post(conn: http.client.HTTPConnection, body: dict[str, Any]) -> None:
    data = json.dumps(body | {"prompt": f"{body['prompt']} {next(SERIAL):08d}"}).encode()
    conn.request("POST", "/v1/completions", body=data,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    r = conn.getresponse()
    r.read()
    assert r.status == 200


def main(out: Path, affinity: bool, streams: int) -> None:
    with TemporaryDirectory() as tmp, SimProcess(profile="instant") as a, \
            SimProcess(profile="instant") as b:  # fmt: skip
        cfg = Path(tmp) / "gw.yaml"
        c = config([a.url, b.url], MODEL)
        c.setdefault("policy", {})["prefix_affinity"] = affinity
        cfg.write_text(yaml.safe_dump(c))
        gw = ProfiledGateway(config=cfg, log=Path(tmp) / "gw.log", out=out,
                             env={"TIERGATE_COMPILED": "0"})  # fmt: skip
        gw.start(120)
        try:
            conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
            for _ in range(1100):
                post(conn, small_body(MODEL))
            for _ in range(streams):
                post(conn, stream_body(MODEL, 64, usage=False))
            conn.close()
        finally:
            gw.stop()
        for _ in range(100):  # written as the interpreter exits
            if out.exists():
                break
            time.sleep(0.1)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), sys.argv[2] == "on", int(sys.argv[3]))
