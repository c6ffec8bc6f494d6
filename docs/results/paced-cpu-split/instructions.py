"""Instructions per small request (callgrind's exact count) of `tiergate serve` run by the
interpreter that runs this script, one request after another in front of one `instant`
simulator (200 to warm up, then 400 counted), and their shares by binary (the interpreter, the
C extensions, libc): each function's own instructions, summed per object from callgrind's
dump. From the repository's root, with valgrind installed:

    PYTHON docs/results/paced-cpu-split/instructions.py OUT_FOLDER
"""

import collections
import http.client
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, os.getcwd())
from loadtests.harness.procs import SimProcess
from loadtests.harness.proxied import small_body
from loadtests.instructions import CallgrindGateway, _post, config, instructions

MODEL = "meta-llama/Llama-2-7b-chat-hf"
WARM, COUNTED = 200, 400


def by_object(dump: Path) -> collections.Counter[str]:
    """Each function's own cost (the lines after `calls=` are a call's inclusive cost: left
    out), summed by the object (`ob=`) it belongs to; names compressed as `(id) name`."""
    names: dict[str, str] = {}
    own: collections.Counter[str] = collections.Counter()
    ob, after_call = "?", False
    for line in dump.read_text().splitlines():
        key, _, value = line.partition("=")
        if key in ("ob", "cob"):
            m = re.match(r"\((\d+)\)(?: (.*))?", value)
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
            if key == "ob":
                ob = names.get(m.group(1), value) if m else value
        elif key == "calls":
            after_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
            elif len(parts := line.split()) >= 2:
                own[Path(ob).name] += int(parts[1])
    return own


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with SimProcess(profile="instant") as sim:
        cfg = out / "gateway.yaml"
        cfg.write_text(yaml.safe_dump(config([sim.url], MODEL)))
        gw = CallgrindGateway(config=cfg, log=out / "gateway.log", out=out / "callgrind.out")
        gw.start(timeout=900)
        try:
            conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
            payload = json.dumps(small_body(MODEL)).encode()
            for _ in range(WARM):
                _post(conn, payload)
            subprocess.run(["callgrind_control", "-z", str(gw.pid)], check=True,
                           capture_output=True)  # fmt: skip
            for _ in range(COUNTED):
                _post(conn, payload)
            total = instructions(gw.pid) / COUNTED
            subprocess.run(["callgrind_control", "-d", "counted", str(gw.pid)], check=True,
                           capture_output=True)  # fmt: skip
        finally:
            gw.stop()
    print(f"Python {sys.version}: {total:,.0f} instructions a request")
    own = by_object(out / "callgrind.out.1")
    whole = sum(own.values())
    for name, n in own.most_common(8):
        print(f"  {100 * n / whole:5.1f}%  {name}")


main()
