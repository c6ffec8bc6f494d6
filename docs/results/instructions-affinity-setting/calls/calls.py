"""Python's call counts (cProfile) in a gateway in front of two `instant` simulators,
`policy.prefix_affinity` on or off: 1,100 one-off small requests, then N one-off 64-token
streams; the profile written to OUT when the gateway stops. From the repository's root:

    python docs/results/instructions-affinity-setting/calls/calls.py OUT on|off N

Four runs (on and off, N = 0 and 400) give per stream, by compare.py, the calls that affinity
adds: (on, 400) - (on, 0) against (off, 400) - (off, 0).
"""

from __future__ import annotations

import http.client
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path.cwd()))
from oneoff import MODEL, post, two_sims

from loadtests.harness.procs import GatewayProcess
from loadtests.harness.proxied import small_body, stream_body


@dataclass
class ProfiledGateway(GatewayProcess):
    out: Path = Path("gateway.prof")

    def command(self) -> list[str]:
        return [sys.executable, "-P", "-m", "cProfile", "-o", str(self.out), "-m", "tiergate",
                *self.argv()]  # fmt: skip


def main(out: Path, affinity: bool, streams: int) -> None:
    with TemporaryDirectory() as tmp, two_sims(Path(tmp), affinity) as cfg:
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
