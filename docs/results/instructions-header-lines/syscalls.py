"""System calls a small request costs the gateway: `strace -c` attached to `tiergate serve`
(one worker, in front of one `instant` simulator, the bench's instructions configuration:
scraping off) while N small completions go one after another on one kept-alive connection.

Usage (from the repository root): python docs/results/instructions-header-lines/syscalls.py [N]"""

import http.client
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from engines.sim.profile import load_profile
from loadtests import instructions as bench
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import small_body

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
model = load_profile(bench.PROFILE).model
with tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    with SimProcess(profile=bench.PROFILE, log=work / "s.log", args=["--model", model]) as sim:
        (work / "g.yaml").write_text(yaml.safe_dump(bench.config([sim.url], model)))
        gw = GatewayProcess(config=work / "g.yaml", log=work / "g.log")
        gw.start(timeout=120)
        try:
            conn = http.client.HTTPConnection(gw.host, gw.port)
            body = json.dumps(small_body(model))

            def post() -> None:
                conn.request("POST", "/v1/completions", body=body,
                             headers={"content-type": "application/json"})  # fmt: skip
                r = conn.getresponse()
                r.read()
                assert r.status == 200

            for _ in range(300):
                post()
            out = work / "strace.txt"
            st = subprocess.Popen(["strace", "-f", "-c", "-o", str(out), "-p", str(gw.pid)],
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
            assert st.stderr is not None
            while "attached" not in (said := st.stderr.readline()):  # strace follows it now
                if not said:
                    raise RuntimeError("strace could not attach to the gateway")
            for _ in range(N):
                post()
            st.send_signal(signal.SIGINT)
            st.wait()
            table = out.read_text()
        finally:
            gw.stop()
print(f"{N} small requests, one after another\n{table}")
for line in table.splitlines():
    parts = line.split()
    if len(parts) >= 5 and parts[-1].isidentifier() and parts[3].isdigit():
        print(f"{parts[-1]}: {int(parts[3]) / N:.2f} a request")
