"""Callgrind profiles of one-off requests through a gateway in front of two `instant`
simulators, `policy.prefix_affinity` on or off in its configuration (the same tree otherwise):
1,100 one-off small requests (past `policy.affinity_quiet_after`, so the memory of homes is
quiet), 50 of the kind counted, the counters zeroed, 200 counted, the profile dumped to OUT.1.
From the repository's root, then compared by ../relay-inspection/selfcost.py:

    python docs/results/instructions-affinity-setting/profile.py OUT on|off small|stream [paced]

(`paced`: the simulators of `tiergate bench instructions --paced`, 2 ms a step.)
"""

from __future__ import annotations

import http.client
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path.cwd()))
from oneoff import MODEL, post, two_sims

from loadtests.harness.proxied import small_body, stream_body
from loadtests.instructions import CallgrindGateway, _control, zero


def main(out: Path, affinity: bool, kind: str, profile: str) -> None:
    with TemporaryDirectory() as tmp, two_sims(Path(tmp), affinity, profile) as cfg:
        gw = CallgrindGateway(config=cfg, log=Path(tmp) / "gw.log", out=out,
                              env={"TIERGATE_COMPILED": "0"})  # fmt: skip
        gw.start(300)
        try:
            conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
            body = stream_body(MODEL, 64, usage=False) if kind == "stream" else small_body(MODEL)
            for _ in range(1100):
                post(conn, small_body(MODEL))
            for _ in range(50):
                post(conn, body)
            zero(gw.pid)
            for _ in range(200):
                post(conn, body)
            _control(gw.pid, "-d")
        finally:
            gw.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), sys.argv[2] == "on", sys.argv[3],
         sys.argv[4] if len(sys.argv) > 4 else "instant")  # fmt: skip
