"""The system calls per paced small request (64 connections, 400 requests a second, 5 s, one
`instant` simulator) of `tiergate serve` and of vLLM's router, counted by `strace -c` attached
to every thread of each in turn. strace slows the calls it counts: the counts are what to read,
not the times. From the repository's root, with strace installed:

    python docs/results/paced-cpu-split/syscalls.py OUT_FOLDER
"""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, os.getcwd())
from loadtests import peers
from loadtests.harness.proxied import paced_small, small_body

MODEL = "meta-llama/Llama-2-7b-chat-hf"


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    opts = peers.Options(targets=("tiergate", "vllm-router"), install=False)
    payload = json.dumps(small_body(MODEL)).encode()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        targets_up = peers.running_targets(opts, Path(tmp), MODEL, [], Console(stderr=True))
        running, _ = stack.enter_context(targets_up)
        for t in running:
            if t.name == "direct":
                continue
            pids = t.server_pids()
            url = f"{t.url}/v1/completions"
            asyncio.run(paced_small(url, payload, 64, 400, 1, pids))  # connections made
            threads = [tid for pid in pids for tid in os.listdir(f"/proc/{pid}/task")]
            counts = out / f"{t.name}.txt"
            tracer = subprocess.Popen(
                ["strace", "-c", "-o", str(counts), *(a for tid in threads for a in ("-p", tid))],
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1)  # attached
            samples = asyncio.run(paced_small(url, payload, 64, 400, 5, pids))
            tracer.send_signal(signal.SIGINT)
            tracer.wait()
            total = counts.read_text().splitlines()[-1].split()
            calls = int(total[3])
            print(f"{t.name}: {len(threads)} threads, {len(samples.values)} requests, "
                  f"{calls} system calls, {calls / len(samples.values):.2f} a request "
                  f"({counts.name})")  # fmt: skip


main()
