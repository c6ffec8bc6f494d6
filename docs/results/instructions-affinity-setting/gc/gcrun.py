"""The garbage collector's passes in a gateway (two `instant` simulators, `policy.prefix_affinity`
on or off) over 2,000 one-off 64-token streams, after 1,150 one-off small requests (the memory
of homes quiet): OUT.1 at the end of the small requests, OUT.2 at the end of the streams.
From the repository's root:

    python docs/results/instructions-affinity-setting/gc/gcrun.py OUT on|off 2000
"""

from __future__ import annotations

import http.client
import os
import signal
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path.cwd()))
from oneoff import MODEL, post, two_sims

from loadtests.harness.procs import GatewayProcess
from loadtests.harness.proxied import small_body, stream_body

HERE = Path(__file__).resolve().parent


def main(out: str, affinity: bool, streams: int) -> None:
    with TemporaryDirectory() as tmp, two_sims(Path(tmp), affinity) as cfg:
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
