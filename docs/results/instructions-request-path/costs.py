"""Instructions one call costs on this interpreter, counted by callgrind: the figures the request
path's changes at da71d01 rest on.

Each case runs its statement N and 11 x N times in a fresh interpreter under callgrind; the
difference of the two totals over 10 x N is the cost of one run of the statement, the
interpreter's start and the setup cancelled out.

    python docs/results/instructions-request-path/costs.py [N]    (N: 1000 by default)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SETUP = f"""
import sys, json
sys.path.insert(0, {str(ROOT)!r})
from dataclasses import dataclass
from typing import NamedTuple
import pydantic_core
from prometheus_client import CollectorRegistry, Counter
from gateway.observe.telemetry import Telemetry

@dataclass(frozen=True, slots=True)
class Frozen:
    running: int = 0; waiting: int = 0; kv_usage: float = 0.0; inflight: int = 0
    healthy: bool = True; stale: bool = False; slos: tuple = (); recent: tuple = ()
    inflight_at_scrape: int | None = None

class Named(NamedTuple):
    running: int = 0; waiting: int = 0; kv_usage: float = 0.0; inflight: int = 0
    healthy: bool = True; stale: bool = False; slos: tuple = (); recent: tuple = ()
    inflight_at_scrape: int | None = None

body = b'{{"model": "m", "prompt": "hello", "max_tokens": 4, "ignore_eos": true}}'
counter = Counter("c", "c", ["a", "b"], registry=CollectorRegistry()).labels("1", "2")
t = Telemetry()
key = (t.requests, "latency", "http://a", "m", "200")
"""
CASES = {
    "a 9-field frozen dataclass, by keyword": "Frozen(running=1, waiting=0, kv_usage=0.0, "
    "inflight=0, healthy=True, stale=False, slos=(), recent=(), inflight_at_scrape=0)",
    "a 9-field named tuple, by keyword": "Named(running=1, waiting=0, kv_usage=0.0, inflight=0, "
    "healthy=True, stale=False, slos=(), recent=(), inflight_at_scrape=0)",
    "a 9-field named tuple, by position": "Named(1, 0, 0.0, 0, True, False, (), (), 0)",
    "json.loads of a small body": "json.loads(body)",
    "pydantic_core.from_json of it": "pydantic_core.from_json(body)",
    "a prometheus_client counter child's inc()": "counter.inc()",
    "Telemetry.add (summed until /metrics is read)": "t.add(key)",
    "nothing (the loop itself)": "pass",
}


def total(statement: str, n: int, setup: str = SETUP, local: bool = False) -> int:
    """Instructions of an interpreter that runs `setup`, then `statement` `n` times: in a loop
    at the module's level, or (`local`) inside a function, its names local ones."""
    if local:
        script = f"{setup}\ndef run(n):\n    for _ in range(n):\n        {statement}\nrun({n})\n"
    else:
        script = f"{setup}\nfor _ in range({n}):\n    {statement}\n"
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)  # fmt: skip
    match = re.search(r"Collected : (\d+)", out.stderr)
    assert match, out.stderr[-2000:]
    return int(match.group(1))


def table(cases: dict[str, str], n: int, setup: str = SETUP, local: bool = False) -> None:
    """Each case's instructions per run of its statement, as a Markdown table."""
    print(f"| call | instructions per call (N = {n}) |\n|---|---|")
    for name, statement in cases.items():
        per_call = (total(statement, 11 * n, setup, local)
                    - total(statement, n, setup, local)) / (10 * n)  # fmt: skip
        print(f"| {name} | {per_call:,.0f} |", flush=True)


def main() -> None:
    table(CASES, int(sys.argv[1]) if len(sys.argv) > 1 else 1000)


if __name__ == "__main__":
    main()
