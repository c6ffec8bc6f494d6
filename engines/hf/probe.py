"""Time `tiergate hf` over HTTP: start it, stream requests at it, read its metrics, stop it.

    python -m engines.hf.probe --attn sdpa --out probe.json [--runs 3]

Starts the server with `--random-weights` (Llama-2-7B's shape, no download) on a free port, then:
three 256-token streams one after another (50-word prompt; TTFT and TPOT timed on the client),
four 64-token streams at once (their end times show the batch-1 queue, and the queue gauges
are read while they run), one chat request (400 without a chat template) and one non-streamed
request. Needs the `hf` extra and a GPU, like the server itself.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

MODEL = "llama2-7b"
PROMPT = " ".join(f"word{i}" for i in range(50))


def stream(url: str, max_tokens: int, model: str = MODEL) -> dict[str, Any]:
    """One streamed completion: client-side TTFT, TPOT and E2E, and the usage it reported."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    times: list[float] = []
    usage = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if data.get("choices") and data["choices"][0]["text"]:
                times.append(time.perf_counter())
            usage = data.get("usage") or usage
    if len(times) < 2:
        raise RuntimeError(f"a stream brought {len(times)} text chunks")
    return {"ttft_ms": (times[0] - start) * 1000,
            "tpot_ms": (times[-1] - times[0]) / (len(times) - 1) * 1000,
            "e2e_s": times[-1] - start, "chunks": len(times), "usage": usage}  # fmt: skip


def probe(url: str, runs: int, *, model: str = MODEL, long: int = 256,
          short: int = 64) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {}
    stream(url, 8, model)  # warm-up
    single = [stream(url, long, model) for _ in range(runs)]
    out["single"] = single
    out["single_median"] = {
        k: statistics.median(r[k] for r in single) for k in ("ttft_ms", "tpot_ms", "e2e_s")
    }
    ends: list[float] = []
    threads = [threading.Thread(target=lambda: ends.append(stream(url, short, model)["e2e_s"]))
               for _ in range(4)]  # fmt: skip
    for t in threads:
        t.start()
    time.sleep(0.3)
    metrics = httpx.get(url + "/metrics").text.splitlines()
    gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    out["gauges_during"] = [line for line in metrics if line.startswith(gauges)]
    for t in threads:
        t.join()
    out["four_concurrent_e2e_s"] = sorted(ends)
    hello = [{"role": "user", "content": "hi"}]
    r = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": hello})
    out["chat_without_template"] = [r.status_code, r.json()]
    r = httpx.post(url + "/v1/completions",
                   json={"model": model, "prompt": "a b c", "max_tokens": 5})  # fmt: skip
    out["non_streamed"] = r.json()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_health(url: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    """Poll `url` until it answers 200 (loading the model takes a while); fail if `proc` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout}s")


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


def main() -> None:  # pragma: no cover - needs torch and a GPU
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attn", default="sdpa", help="eager, sdpa or flash_attention_2")
    parser.add_argument("--runs", type=int, default=3, help="sequential 256-token streams")
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args()
    port = _free_port()
    log = args.out.with_suffix(".server.log")
    cmd = [sys.executable, "-m", "tiergate", "hf", "--random-weights", "--attn", args.attn,
           "--served-model-name", MODEL, "--port", str(port)]  # fmt: skip
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url + "/health", 600, proc)
        ready_s = time.monotonic() - started
        result = {"attn": args.attn, "startup_s": ready_s, **probe(url, args.runs)}
    finally:
        _stop(proc, 30)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["single_median"]))


if __name__ == "__main__":  # pragma: no cover
    main()
