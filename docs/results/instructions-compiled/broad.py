"""Instructions per request (callgrind) of two gateways in front of one `instant` simulator:
`routing`, this tree with its routing modules compiled (7a31702's build), and `broad`, a copy of
the tree at BROAD_ROOT where more of the request's path was compiled by hand with mypyc in place
(besides routing: gateway/core/{sse,exchange,http1}.py, gateway/pipeline/{intake,router,
admission,homes,usage,retry}.py, gateway/observe/telemetry.py; not gateway/pipeline/upstream.py,
which mypyc refuses: a `continue` inside try/finally). 50 requests to warm up, then 300 counted,
of each kind, 2 rounds in alternating order.

    python broad.py BROAD_ROOT
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path

import yaml

from engines.sim.profile import load_profile
from loadtests.harness.procs import SimProcess
from loadtests.harness.proxied import small_body, stream_body
from loadtests.instructions import PROFILE, CallgrindGateway, _post, config, instructions, zero


def main(broad: Path) -> None:
    work = Path("/tmp/tiergate-broad")
    work.mkdir(exist_ok=True)
    model = load_profile(PROFILE).model
    bodies = {"small": small_body(model), "stream": stream_body(model, 64, usage=True)}
    res: dict[tuple[str, str], list[float]] = {}
    with SimProcess(profile=PROFILE, log=work / "sim.log", args=["--model", model]) as sim:
        cfg = work / "gateway.yaml"
        cfg.write_text(yaml.safe_dump(config([sim.url], model)))
        arms: list[tuple[str, Path | None]] = [("broad", broad), ("routing", None)]
        for r in range(2):
            for name, root in arms if r % 2 == 0 else arms[::-1]:
                gw = CallgrindGateway(config=cfg, log=work / f"{name}.log",
                                      out=work / f"{name}.cg", root=root)  # fmt: skip
                gw.start(timeout=900)
                try:
                    for kind, body in bodies.items():
                        conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
                        payload = json.dumps(body).encode()
                        for _ in range(50):
                            _post(conn, payload)
                        zero(gw.pid)
                        for _ in range(300):
                            _post(conn, payload)
                        res.setdefault((name, kind), []).append(instructions(gw.pid) / 300)
                        conn.close()
                finally:
                    gw.stop()
    for (name, kind), v in sorted(res.items()):
        print(name, kind, [round(x) for x in v])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
