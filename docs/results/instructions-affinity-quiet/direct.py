"""One gateway under callgrind in front of two instant simulators, from this tree, with
`policy.prefix_affinity` as asked: WARM one-off small requests (past the quiet threshold when
above 1,024), 50 one-off streams, the counters zeroed, 200 one-off streams, the counts dumped.

    python docs/results/instructions-affinity-quiet/direct.py NAME on|off WARM [FOLDER]

The dump (FOLDER/NAME.out.1) holds the counted window; its `summary:` line divided by 200 is
the instructions per stream.
"""

from __future__ import annotations

import http.client
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from loadtests.harness.procs import SimProcess
from loadtests.harness.proxied import small_body, stream_body
from loadtests.instructions import CallgrindGateway, _control, config, zero

MODEL = "meta-llama/Llama-2-7b-chat-hf"
COUNTED = 200


def post(conn: http.client.HTTPConnection, body: dict[str, Any]) -> None:
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})  # fmt: skip
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"the gateway answered {r.status}")


def main() -> None:
    name, affinity, warm = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3])
    work = Path(sys.argv[4] if len(sys.argv) > 4 else "/tmp/affinity-direct")
    work.mkdir(parents=True, exist_ok=True)
    args = ["--model", MODEL]
    with SimProcess(profile="instant", log=work / "sim.log", args=args) as one, \
            SimProcess(profile="instant", log=work / "sim2.log", args=args) as two:  # fmt: skip
        cfg = config([one.url, two.url], MODEL)
        cfg.setdefault("policy", {})["prefix_affinity"] = affinity
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gw = CallgrindGateway(config=path, log=work / f"{name}-gw.log", out=work / f"{name}.out",
                              env={"TIERGATE_COMPILED": "0"})  # fmt: skip
        gw.start(600)
        try:
            conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
            small, stream = small_body(MODEL), stream_body(MODEL, 64, usage=True)
            for i in range(warm):
                post(conn, small | {"prompt": f"{small['prompt']} s{i:08d}"})
            serial = itertools.count()
            for n in (50, COUNTED):
                if n == COUNTED:
                    zero(gw.pid)
                for _ in range(n):
                    post(conn, stream | {"prompt": f"{stream['prompt']} {next(serial):08d}"})
            _control(gw.pid, "-d")
        finally:
            gw.stop()


if __name__ == "__main__":
    main()
