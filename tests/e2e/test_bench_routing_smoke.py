"""A seconds-long run of `tiergate bench routing`: the report is produced and consistent."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.harness.deployments import DEPLOYMENTS
from loadtests.harness.phases import STEP, Slo
from loadtests.routing import run

pytestmark = pytest.mark.e2e


def test_routing_benchmark_report(tmp_path: Path) -> None:
    policies = ("golden-range", "throughput-only")
    report = run(
        shapes=("step",), policies=policies, phase_s=0.4, speedup=10, output_tokens=32,
        out_dir=tmp_path, slo=Slo(), console=Console(width=200),
    )  # fmt: skip
    step = report["shapes"]["step"]
    assert step["users"] == list(STEP)
    for policy in policies:
        phases = step["policies"][policy]
        assert len(phases) == len(STEP)
        for ph in phases:
            assert ph["requests"] > 0
            assert ph["errors"] == 0
            assert ph["ttft_p50"] <= ph["ttft_p99"]
            assert ph["tpot_p50"] <= ph["tpot_p99"]
            assert 0 <= ph["goodput"] <= ph["requests"] / ph["seconds"] + 1e-9
            assert sum(ph["by_tier"].values()) == ph["requests"]
        whole = step["whole"][policy]
        assert whole["slo_met"] == sum(round(p["goodput"] * p["seconds"]) for p in phases)
    # Routing itself, not timing: one user at a time rides the latency tier under golden-range,
    # and never under throughput-only.
    assert set(step["policies"]["golden-range"][0]["by_tier"]) == {"latency"}
    assert set(step["policies"]["throughput-only"][0]["by_tier"]) == {"throughput"}
    assert len(step["phase_verdicts"]) == len(STEP)
    v = step["whole_verdict"]
    assert v["best_other"] == "throughput-only"
    assert math.isclose(v["noise"], round(2 * math.sqrt(v["golden"] + v["other"]), 1))
    for name in ("routing.json", "routing.md", "routing.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "routing.json").read_text()) == report


def test_learned_against_the_oracle_on_a_shifting_deployment(tmp_path: Path) -> None:
    report = run(
        shapes=("burst",), policies=("learned", "golden-range"), phase_s=0.4, speedup=10,
        output_tokens=32, out_dir=tmp_path, slo=Slo(1.0, 0.012), console=Console(width=200),
        deployment="shift", oracle_limits=(4, 16), name="routing-shift-interactive",
    )  # fmt: skip
    assert report["deployment"] == {
        "name": "shift", "latency": ["v4"], "throughput": ["v3", "v3"], "shift": [0.5, "v4-low"],
        "about": DEPLOYMENTS["shift"].about, "slo_class": ""}  # fmt: skip
    burst = report["shapes"]["burst"]
    assert set(burst["policies"]) == {"learned", "golden-range", "limit-4", "limit-16"}
    # a cap of 4 streams keeps the latency tier at 4: more than that went to the pool
    assert max(ph["by_tier"].get("latency", 0) for ph in burst["policies"]["limit-4"]) > 0
    lv = burst["learned_verdict"]
    met = {p: w["slo_met"] for p, w in burst["whole"].items()}
    assert lv["learned"] == met["learned"]
    assert lv["oracle"]["policy"] == max(("limit-4", "limit-16"), key=lambda p: met[p])
    assert lv["golden"]["slo_met"] == met["golden-range"]
    md = (tmp_path / "routing-shift-interactive.md").read_text()
    assert "--deployment shift" in md
    assert "--oracle-limit 4 --oracle-limit 16" in md
    assert "learned" in md
    assert "vs oracle" in md
