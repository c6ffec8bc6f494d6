"""The metrics page's parse (`parse_vllm_metrics`) with each label set read in one match
(`gateway.wire.metrics._parse_labels` as labels-at-once.diff makes it) against one label at a
time (the loop it replaced, which the diff keeps as `_labels_one_by_one` for the error it
names), in one process: the pages of
an `instant` simulator that has served 200 requests, as the monitor asks for it (only the
series read: `METRICS_QUERY`) and whole. 7 rounds, the order rotating; each the least of 5
repeats of 300 parses. The two must give the same stats (checked first).

Usage (from the repository root, with labels-at-once.diff applied: not kept):
python docs/results/instructions-header-lines/labels_at_once.py"""

import json
import statistics
import sys
import tempfile
import timeit
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from engines.sim.profile import load_profile
from gateway.wire import metrics
from gateway.wire.vllm.adapter import METRICS_QUERY
from gateway.wire.vllm.metrics import parse_vllm_metrics
from loadtests.harness.procs import SimProcess

ROUNDS, N = 7, 300
AT_ONCE = metrics._parse_labels


def get(url: str, data: bytes | None = None) -> str:
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(r.read().decode())


def parse(page: str, at_once: bool) -> float:
    """Seconds a parse takes (the least of 5 repeats of N)."""
    metrics._parse_labels = AT_ONCE if at_once else metrics._labels_one_by_one
    try:
        return min(timeit.repeat(lambda: parse_vllm_metrics(page), number=N, repeat=5)) / N
    finally:
        metrics._parse_labels = AT_ONCE


profile = load_profile("instant")
with tempfile.TemporaryDirectory() as tmp:
    log = Path(tmp) / "sim.log"
    with SimProcess(profile="instant", log=log, args=["--model", profile.model]) as sim:
        body = {"model": profile.model, "prompt": "hello", "max_tokens": 4}
        for _ in range(200):
            get(sim.url + "/v1/completions", json.dumps(body).encode())
        pages = {"queried": get(f"{sim.url}/metrics?{METRICS_QUERY}"),
                 "whole": get(sim.url + "/metrics")}  # fmt: skip

for name, page in pages.items():
    metrics._parse_labels = metrics._labels_one_by_one
    before = parse_vllm_metrics(page)
    metrics._parse_labels = AT_ONCE
    assert parse_vllm_metrics(page) == before, name
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(ROUNDS):
        for at_once in (True, False) if r % 2 == 0 else (False, True):
            times[at_once].append(parse(page, at_once))
    lines = page.count("\n")
    print(f"{name} page ({len(page):,} bytes, {lines} lines), {ROUNDS} rounds x 5 x {N} parses:")
    for at_once, label in ((False, "one by one"), (True, "at once")):
        ts = [t * 1e6 for t in times[at_once]]
        each = " / ".join(f"{t:.0f}" for t in ts)
        print(f"  {label}: median {statistics.median(ts):.0f} us a parse (rounds {each})")
    ratios = [a / b for a, b in zip(times[True], times[False], strict=True)]
    each = " / ".join(f"{x:.3f}" for x in ratios)
    print(f"  at once / one by one: median {statistics.median(ratios):.3f}x (rounds {each})")
