"""Smoke test of the Locust load test (loadtests/locust/locustfile.py and a scenario) against a
small
simulated stack: one v4 latency simulator, one v3 throughput simulator, the gateway."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.stack import Stack, start_stack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ["--prompt-tokens", "10", "--output-tokens", "32"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("stack"), latency=1, throughput=1, speedup=10)
    try:
        yield s
    finally:
        s.stop()


def run_locust(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "locust", "--headless", *args]
    # timeout: subprocess.run kills locust (one process, no --processes) if it overruns
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_locustfile_streams_and_records(stack: Stack, tmp_path: Path) -> None:
    jsonl = tmp_path / "run.jsonl"
    out = run_locust(
        # Until 12 requests are recorded, however long a busy machine takes (60 s at most).
        ["-f", "loadtests/locust/locustfile.py", "-u", "4", "-r", "4", "-t", "60s",
         "--stop-after", "12",
         "-H", stack.gateway.url, *WORKLOAD, "--jsonl", str(jsonl), "--csv", str(tmp_path / "run"),
         "--json-file", str(tmp_path / "stats")],  # Locust adds .json
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    recs = records(jsonl)
    assert len(recs) >= 12
    for r in recs:
        assert r["ok"] is True, r
        assert r["status"] == 200
        assert r["output_tokens"] == 32
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["tpot_s"] > 0
        assert r["tier"] in {"latency", "throughput"}
        assert r["backend"] in {s.url for s in stack.sims}
        assert r["label"] == "locust"
    # Locust's statistics as it ends (its CSV files are rewritten once a second, so they may
    # lag the last requests; the JSON file is written at the end).
    stats = json.loads((tmp_path / "stats.json").read_text())
    kinds = {row["method"] for row in stats}
    assert {"TTFT", "TPOT", "E2E", "POST"} <= kinds
    assert all(row["name"] in {"latency", "throughput"} for row in stats if row["method"] == "TPOT")
    assert sum(row["num_requests"] for row in stats if row["method"] == "POST") >= 12
    with open(tmp_path / "run_stats.csv", newline="") as f:
        assert "Type" in (csv.DictReader(f).fieldnames or [])
    assert "tiergate summary" in out.stdout


def test_step_scenario(stack: Stack, tmp_path: Path) -> None:
    jsonl = tmp_path / "step.jsonl"
    out = run_locust(
        ["-f", "loadtests/locust/scenarios/step.py", "--phase-seconds", "1",
         "-H", stack.gateway.url,
         *WORKLOAD, "--jsonl", str(jsonl)],
        timeout=45,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    recs = records(jsonl)
    assert recs
    assert all(r["ok"] and r["label"] == "step" for r in recs)
    # requests were sent in each step (users = the step's target user count)
    assert {1, 16, 32, 64} <= {r["users"] for r in recs}
