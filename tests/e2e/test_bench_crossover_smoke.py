"""`tiergate bench crossover` as a user runs it, against two real simulators (v4 with EAGLE as
the latency engine, v3 AWQ as the throughput engine) 20 times faster than real time, with a
bearer key and the model found through /v1/models: the printed tables, the written report, and
figures consistent with themselves and with the engines (v4 faster per token at 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.config.settings import PolicyConfig
from loadtests.crossover import first_crossing, recommend, slo_limit
from loadtests.harness.procs import SimProcess

# Serial: it compares tokens a second at 1 and 32 streams over one-second windows, which the
# parallel phase's other tests, sharing the CPUs with the simulators, held to 3.1x once where
# the engines give more than 4x alone (scripts/test runs serial tests alone).
pytestmark = [pytest.mark.e2e, pytest.mark.serial, pytest.mark.timeout(120)]

KEY = "crossover-key"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[str, str]]:
    args = ["--speedup", "20", "--api-key", KEY]
    with SimProcess(profile="v4", args=args) as v4, SimProcess(profile="v3", args=args) as v3:
        yield v4.url, v3.url


def _bench(engines: tuple[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tiergate", "bench", "crossover", "--latency", engines[0],
           "--throughput", engines[1] + "/v1", *args]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=100,
                          env={**os.environ, "COLUMNS": "160"})  # fmt: skip


def test_report_against_two_simulators(engines: tuple[str, str], tmp_path: Path) -> None:
    levels = [1, 8, 32]
    done = _bench(engines, "--api-key", KEY, "--levels", "32,1,8", "--seconds", "1",
                  "--slo-tpot-ms", "0.5", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("crossover.json", "crossover.md", "crossover.png"):
        assert (tmp_path / name).stat().st_size > 0
    report = json.loads((tmp_path / "crossover.json").read_text())

    assert report["settings"]["levels"] == levels
    assert report["order"] == [["latency", "throughput"], ["throughput", "latency"],
                               ["latency", "throughput"]]  # fmt: skip
    assert report["engines"]["latency"]["model"] == "meta-llama/Llama-2-7b-chat-hf"
    tpot: dict[str, list[float]] = {}
    for role, runs in report["runs"].items():
        assert [s["concurrency"] for s in runs] == levels
        for s, order in zip(runs, report["order"], strict=True):
            assert s["position"] == order.index(role)
            assert s["errors"] == 0
            assert s["short"] == 0  # ignore_eos: every request made its 256 tokens
            assert s["n"] > 0
            assert 0 < s["ttft_p50_ms"] <= s["ttft_p99_ms"]
            assert 0 < s["tpot_p50_ms"] <= s["tpot_p99_ms"]
            assert s["tok_s"] > 0
            assert s["window_s"] > 0
        tpot[role] = [s["tpot_p50_ms"] for s in runs]
    # Speculative decoding at one stream: well under the plain engine's time per token.
    assert tpot["latency"][0] < 0.7 * tpot["throughput"][0]
    # More streams, more tokens per second, on both engines.
    for role, runs in report["runs"].items():
        assert runs[-1]["tok_s"] > 4 * runs[0]["tok_s"], role

    # The conclusions are the pure functions' reading of the measured curves.
    crossing = first_crossing(levels, tpot["latency"], tpot["throughput"])
    assert report["crossover"]["side"] == crossing.side
    assert report["crossover"]["at"] == crossing.at
    assert crossing.side in ("crossed", "never")  # v4 is faster at 1, whatever 32 shows
    rec = recommend(levels, tpot["latency"], tpot["throughput"])
    assert rec is not None
    assert report["recommendation"]["policy"] == rec.params.model_dump(
        include=rec.params.model_fields_set
    )
    block = yaml.safe_load(report["recommendation"]["yaml"])["policy"]
    config = PolicyConfig(**block)  # the gateway accepts the printed block as it is
    assert config.name == "golden-range"
    assert 1 <= config.latency_max_concurrency <= config.latency_hard_cap <= 32
    # The SLO of 0.5 ms (sped up 20x: 10 ms): v4 meets it at 1, v3 does not.
    (slo,) = report["slo"]
    assert slo["tpot_ms"] == 0.5
    assert slo["throughput"]["text"] == "none"
    assert slo["latency"]["limit"] >= 1
    assert slo["latency"]["limit"] == slo_limit(levels, tpot["latency"], 0.5).limit

    md = (tmp_path / "crossover.md").read_text()
    assert "```bash\ntiergate bench crossover --latency" in md
    assert KEY not in md
    assert KEY not in json.dumps(report)
    assert KEY not in done.stdout
    assert "--api-key '***'" in md
    assert report["crossover"]["text"] in md
    assert report["recommendation"]["yaml"].strip() in md
    for role in ("latency", "throughput"):
        assert f"| 32 | {role} | {report['runs'][role][-1]['n']} | 0 |" in md
    assert "policy:" in done.stdout
    assert "Crossover:" in done.stdout


def test_requests_per_user_and_errors(engines: tuple[str, str], tmp_path: Path) -> None:
    done = _bench(engines, "--api-key", KEY, "--levels", "1,4", "--requests-per-user", "2",
                  "--model", "meta-llama/Llama-2-7b-chat-hf", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "crossover.json").read_text())
    assert report["settings"]["requests_per_user"] == 2
    assert report["settings"]["seconds"] is None
    for runs in report["runs"].values():
        assert [(s["concurrency"], s["errors"]) for s in runs] == [(1, 0), (4, 0)]
        # the one user's second request; at 4, the second requests that ended before the
        # first user stopped (its first was warm-up)
        assert runs[0]["n"] == 1
        assert 1 <= runs[1]["n"] <= 4
    assert "2 requests per user" in (tmp_path / "crossover.md").read_text()

    no_key = _bench(engines, "--levels", "1", "--seconds", "0")
    assert no_key.returncode == 1
    assert "401" in no_key.stderr
    assert "--api-key" in no_key.stderr
    both = _bench(engines, "--seconds", "1", "--requests-per-user", "2")
    assert both.returncode == 2
    assert "not both" in both.stderr
