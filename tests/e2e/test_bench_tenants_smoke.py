"""A seconds-long run of `tiergate bench tenants`, priorities on (one arm: intake's tests cover
what turning them off changes): the report's shape, and the batch tenant on the pool only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.tenants import ON, Options, run

pytestmark = pytest.mark.e2e


def test_priorities_keep_batch_work_off_the_latency_tier(tmp_path: Path) -> None:
    opts = Options(
        interactive_users=1, batch_users=6, seconds=3, rounds=1, speedup=8, prompt_tokens=20,
        interactive_tokens=16, batch_tokens=32, pool_max_seqs=2, arms=(ON,),
        out=tmp_path / "tenants.json", chart=False, command="tiergate bench tenants (test)",
    )  # fmt: skip
    report = run(opts, Console(width=200))
    arms = report["arms"]
    assert set(arms) == {ON}
    for figs in arms.values():
        assert figs["samples"] > 5
        assert figs["interactive_errors"] == 0
        assert figs["batch_errors"] == 0
        assert figs["batch_done"] > 0
        assert figs["ttft_p50_ms"] <= figs["ttft_p99_ms"]
    # Priorities on: batch keys on the pool only, interactive on the latency tier.
    assert set(arms[ON]["tiers"]["batch"]) == {"throughput"}
    assert "latency" in arms[ON]["tiers"]["interactive"]
    assert report["verdicts"] == []  # no solo arm: nothing to hold the goal against
    assert json.loads((tmp_path / "tenants.json").read_text()) == report
    md = (tmp_path / "tenants.md").read_text()
    assert "## Where the requests were served" in md
