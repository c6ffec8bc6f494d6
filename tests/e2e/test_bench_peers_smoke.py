"""`tiergate bench peers` end to end with tiny settings, against real processes, with whichever
peers are already installed in the peers' virtual environment ($TIERGATE_PEERS_VENV, else the
default folder; nothing is installed here): every target that ran has a row with samples, every
one that did not has a note saying why, the goals follow from the figures, and no process
outlives the bench. Nothing here judges speed."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.harness.nginx import nginx_binary
from loadtests.harness.peerenv import PEERS, default_venv, ensure
from loadtests.harness.procs import GranianGatewayProcess
from loadtests.peers import (
    FIGURES,
    GATEWAY,
    GRANIAN,
    MAX_ADDED_P50_1_MS,
    MAX_CPU_MS,
    TARGETS,
    WORKERS,
    Options,
    has_workers,
    run,
    workers_probe,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _children(pid: int) -> set[int]:
    """Live processes whose parent is `pid` (Linux /proc)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def test_peers_report_has_a_row_or_a_note_for_every_target(tmp_path: Path) -> None:
    venv = default_venv()
    installed = {n for n, i in ensure(list(PEERS), venv, install=False).items() if i.binary}
    wrk = shutil.which("wrk") is not None
    probe = workers_probe()  # whether `serve` takes --workers, read while the bench runs
    before = _children(os.getpid()) - {probe.pid}
    opts = Options(
        rounds=1, duration_s=0.1, rate=200, wrk_seconds=1 if wrk else 0, venv=venv,
        install=False, out=tmp_path / "peers.json", chart=False,
        command="tiergate bench peers (smoke)",
    )  # fmt: skip
    report = run(opts, Console(file=io.StringIO(), width=200))
    workers = has_workers(probe)
    assert _children(os.getpid()) == before  # every simulator, proxy and peer is gone

    skipped = {"nginx"} if nginx_binary() is None else set()
    skipped |= set() if workers else {WORKERS}
    skipped |= set() if GranianGatewayProcess.available() else {GRANIAN}
    skipped |= set(PEERS) - installed
    assert report.targets == [t for t in TARGETS if t not in skipped]
    for name in skipped:
        assert any(n.startswith(f"{name} skipped: ") for n in report.notes), name
    for name in set(PEERS) - installed:
        assert any(n.startswith(f"{name} skipped: not installed") for n in report.notes)

    for name in report.targets:
        counts, figs = report.counts[name], report.figures[name]
        assert counts["n_1"] > 0
        assert counts["n_c"] > 0
        assert counts["errors_1"] == counts["errors_c"] == 0
        assert 0 < figs["p50_1"].value <= figs["p99_1"].value
        # The system's part of the paced cell's CPU, beside the whole (10 ms ticks: both may
        # read 0 in so short a window).
        assert 0 <= figs["cpu_paced_sys_ms"].value <= figs["cpu_paced_ms"].value
        if name != "direct":
            added = figs["added_p50_1"].value
            assert added == pytest.approx(figs["p50_1"].value - report.value("direct", "p50_1"))
        if wrk:
            assert counts["wrk_requests"] > 0
            assert figs["rps"].value > 0
            assert figs["cpu_ms"].value >= 0
            assert report.tokens_per_stream[name] == 64
            if counts["sse_streams"] > 0:
                assert 0 <= figs["sse_sys_ms"].value <= figs["sse_cpu_ms"].value
            # A slow peer may finish no stream within a 1 s run: the report says so.
            assert counts["sse_streams"] > 0 or any(
                n.startswith(f"{name} completed no 64-token stream") for n in report.notes
            )
    if not wrk:
        assert any("wrk part skipped" in n for n in report.notes)

    # The goals follow from the figures; without LiteLLM its comparisons are not measured.
    v = report.verdicts
    assert len(v) == 2 + len(FIGURES) + 1
    cpu, added = report.value(GATEWAY, "cpu_ms"), report.value(GATEWAY, "added_p50_1")
    assert v[0].met == (None if math.isnan(cpu) else cpu <= MAX_CPU_MS)
    assert v[1].met == (added <= MAX_ADDED_P50_1_MS)
    if "litellm" not in report.targets or not wrk:
        assert v[-1].word == "NOT MEASURED"
    else:
        assert v[-1].met == all(x.met for x in v[2:-1])

    md = opts.markdown_path.read_text()
    assert "tiergate bench peers (smoke)" in md
    assert "## Goals" in md
    for name in report.targets:
        assert f"| {name} |" in md
    for name in skipped:
        assert f"Note: {name} skipped: " in md
    data = json.loads(opts.out.read_text())
    assert data["targets"] == report.targets
    assert [x["result"] for x in data["verdicts"]] == [x.word for x in v]
    for text in (md, opts.out.read_text()):  # no path of this machine in the results
        assert str(venv) not in text
        assert str(Path.home()) not in text
