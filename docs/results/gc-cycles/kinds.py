"""Objects the gateway's cycle collector finds per request, by kind of request: a stack as the
integration tests start it (`loadtests.harness.stack`, simulators at 10x speed), 150 requests
of each kind on one kept-alive connection, the gateway's `python_gc_objects_collected_total`
read before and after each kind.

Usage (from the repository root): python docs/results/gc-cycles/kinds.py"""

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from loadtests.harness.stack import MODEL, start_stack

REQUESTS = 150
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def collected(gw: str) -> float:
    page = httpx.get(gw + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith("python_gc_objects_collected_total"))  # fmt: skip


def kinds(gw: str) -> dict[str, Callable[[httpx.Client], httpx.Response]]:
    done = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    bad = {"content": b"{nope", "headers": {"content-type": "application/json"}}
    return {
        "completion": lambda c: c.post(gw + "/v1/completions", json=done),
        "chat, streamed": lambda c: c.post(
            gw + "/v1/chat/completions", json=CHAT | {"stream": True}
        ),
        "bad JSON": lambda c: c.post(gw + "/v1/completions", **bad),  # type: ignore[arg-type]
        "unknown model": lambda c: c.post(
            gw + "/v1/completions", json={"model": "x", "prompt": "hi"}
        ),
        "bad field": lambda c: c.post(gw + "/v1/completions", json=done | {"max_tokens": -3}),
        "no such path": lambda c: c.get(gw + "/v1/nothing"),
        "/health": lambda c: c.get(gw + "/health"),
        "/state": lambda c: c.get(gw + "/state"),
    }


with tempfile.TemporaryDirectory() as tmp:
    stack = start_stack(Path(tmp), speedup=10)
    try:
        gw = stack.gateway.url
        with httpx.Client(timeout=30) as client:
            for name, ask in kinds(gw).items():
                before = collected(gw)
                codes = sorted({ask(client).status_code for _ in range(REQUESTS)})
                per = (collected(gw) - before) / REQUESTS
                print(f"{name:15s} status {codes}: {per:.2f} objects found a request")
    finally:
        stack.stop()
