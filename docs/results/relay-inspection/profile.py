"""A callgrind profile of the gateway serving 200 streams of 64 tokens (no usage asked) in front
of one `instant` simulator, after 50 to warm up: the profile of the counted ones is written as
OUT.1 (callgrind's dump). From the repository's root:

    TIERGATE_COMPILED=0 python docs/results/relay-inspection/profile.py OUT
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import yaml

sys.path.insert(0, str(Path.cwd()))
from loadtests.harness.procs import SimProcess
from loadtests.harness.proxied import stream_body
from loadtests.instructions import CallgrindGateway, _control, config, zero

MODEL = "meta-llama/Llama-2-7b-chat-hf"


def main(out: Path) -> None:
    with TemporaryDirectory() as tmp, SimProcess(profile="instant") as sim:
        cfg = Path(tmp) / "gw.yaml"
        cfg.write_text(yaml.safe_dump(config([sim.url], MODEL)))
        gw = CallgrindGateway(config=cfg, log=Path(tmp) / "gw.log", out=out)
        gw.start(300)
        try:
            body = json.dumps(stream_body(MODEL, 64, usage=False)).encode()
            conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
            for n in (50, 200):
                if n == 200:
                    zero(gw.pid)
                for _ in range(n):
                    conn.request("POST", "/v1/completions", body=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
                    r = conn.getresponse()
                    r.read()
                    assert r.status == 200
            _control(gw.pid, "-d")
        finally:
            gw.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
