"""The overhead benchmark end to end with tiny settings, against real processes, with HEAD as the
baseline (its code extracted and its gateway run next to the working tree's): the report is
complete and consistent with itself. Nothing here judges speed."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.harness.baseline import REPO
from loadtests.harness.nginx import nginx_binary
from loadtests.overhead import MAX_BASELINE_RATIO, Options, is_proxy, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_overhead_report_is_complete_and_consistent(tmp_path: Path) -> None:
    wrk = shutil.which("wrk") is not None
    opts = Options(
        # ~120 requests per paced cell: each gateway's CPU spans several /proc ticks. Cells stay
        # short so that no gateway idles near the simulator's 5 s keep-alive timeout (uvicorn's,
        # as vLLM's): a pooled upstream connection closed as the gateway reuses it fails the
        # request, and three such failures eject the only backend.
        duration_s=0.3,
        rounds=1,
        rate=400,
        wrk_seconds=1 if wrk else 0,
        out=tmp_path / "overhead.json",
        chart=False,  # importing matplotlib alone takes seconds; the real run draws it
        command="tiergate bench overhead (smoke)",
        baseline="HEAD",
    )
    report = run(opts, Console(file=io.StringIO(), width=200))

    base = report.baseline
    assert base is not None
    assert base.sha == _git("rev-parse", "HEAD")
    assert base.name == f"gateway@{_git('rev-parse', '--short', 'HEAD')}"
    gateways = ["gateway", base.name]
    expected = [n for n in ("direct", "nginx", *gateways) if n != "nginx" or nginx_binary()]
    assert report.targets == expected
    # Each gateway ran from its own code: the working tree's, and the extracted commit's (gone).
    assert report.sources == {"gateway": str(REPO), base.name: base.folder}
    assert Path(base.folder).name == f"baseline-{base.short}"
    assert not Path(base.folder).exists()
    for cells, conns in ((report.latency, (1, 64, 256)), (report.ttft, (1, 64))):
        assert [c.concurrency for c in cells] == list(conns)
        for cell in cells:
            assert list(cell.stats) == expected
            for name, s in cell.stats.items():
                assert s.n > 0
                assert s.errors == 0
                assert 0 < s.p50_ms <= s.p99_ms
                cpu = cell.cpu[name]
                assert cpu.requests == s.n  # no errors: every request completed, in the window
                assert len(cpu.rounds) == len(cell.round_p50_ms[name]) == 1
                assert math.isfinite(cpu.ms_per_request)
                # nginx's worker may spend less than one /proc tick in so short a cell.
                assert cpu.ms_per_request > 0 if name != "nginx" else cpu.ms_per_request >= 0
                assert cpu.ms_per_request == pytest.approx(1000 * cpu.cpu_s / cpu.requests)
            assert sorted(cell.added) == sorted(n for n in expected if is_proxy(n))
            direct = cell.stats["direct"]
            for name, added in cell.added.items():
                assert added.p50_ms == pytest.approx(cell.stats[name].p50_ms - direct.p50_ms)
                assert added.p99_ms == pytest.approx(cell.stats[name].p99_ms - direct.p99_ms)
                assert added.p50_ratio == pytest.approx(cell.stats[name].p50_ms / direct.p50_ms)

    if wrk:
        assert report.wrk_small is not None
        assert report.wrk_sse is not None
        for stats in (report.wrk_small, report.wrk_sse):
            assert list(stats) == expected
            for w in stats.values():
                assert w.requests > 0
                assert w.requests_per_s > 0
                assert len(w.rounds) == 1
        for w in report.wrk_sse.values():
            # 64 text chunks and [DONE] at least; the same stream through every target.
            assert w.events_per_response is not None
            assert w.events_per_response >= 65
            assert w.chunks_per_s == pytest.approx(w.requests_per_s * w.events_per_response)
        assert len({w.events_per_response for w in report.wrk_sse.values()}) == 1
    else:
        assert report.wrk_small is None
        assert any("wrk" in n for n in report.notes)

    words = {v.word for v in report.verdicts}
    assert len(report.verdicts) == 4
    assert words <= {"MET", "NOT MET", "NOT MEASURED"}
    gw64 = next(c for c in report.latency if c.concurrency == 64).added["gateway"]
    assert report.verdicts[0].met == (gw64.p50_ms <= 1.0)
    assert report.verdicts[1].met == (gw64.p99_ms <= 5.0)

    # Gateway vs baseline: one comparison per latency cell, taken from the cells themselves.
    assert [c.concurrency for c in report.vs_baseline] == [1, 64, 256]
    for comp, cell in zip(report.vs_baseline, report.latency, strict=True):
        assert comp.n_new == cell.stats["gateway"].n
        assert comp.n_old == cell.stats[base.name].n
        assert comp.added_p50_new_ms == cell.added["gateway"].p50_ms
        assert comp.added_p50_old_ms == cell.added[base.name].p50_ms
        assert comp.cpu_new_ms == cell.cpu["gateway"].ms_per_request
        assert comp.cpu_old_ms == cell.cpu[base.name].ms_per_request
        assert comp.cpu_ratio == pytest.approx(comp.cpu_new_ms / comp.cpu_old_ms)
        assert math.isfinite(comp.cpu_ratio)
        assert len(comp.cpu_round_ratios) == len(comp.added_p50_round_ratios) == 1
    # The criterion at 64 connections (CPU, then added p50), then the same at 1 connection.
    bv = report.baseline_verdicts
    assert [("CPU" in v.name, ", 64 conn" in v.name) for v in bv] == [
        (True, True), (False, True), (True, False), (False, False)
    ]  # fmt: skip
    c64 = report.vs_baseline[1]
    assert bv[0].met == (c64.cpu_ratio <= MAX_BASELINE_RATIO)
    if not math.isnan(c64.added_p50_ratio):
        assert bv[1].met == (c64.added_p50_ratio <= MAX_BASELINE_RATIO)

    data = json.loads(opts.out.read_text())
    assert data["targets"] == expected
    assert data["baseline"]["name"] == base.name
    assert len(data["vs_baseline"]) == 3
    assert [v["result"] for v in data["baseline_verdicts"]] == [v.word for v in bv]
    assert all(set(cell["cpu"]) == set(expected) for cell in data["latency"] + data["ttft"])
    assert data["nproc"] >= 1
    assert len(data["latency"]) == 3
    assert len(data["ttft"]) == 2
    assert not any(isinstance(v, float) and math.isnan(v) for v in _leaves(data))
    md = opts.markdown_path.read_text()
    assert "tiergate bench overhead (smoke)" in md
    assert "## Verdicts" in md
    assert f"## Gateway vs baseline {base.name}: CPU ms/request" in md
    assert f"## Gateway vs baseline {base.name}: verdicts" in md
    assert f"`{base.name}` ran `git archive {base.sha}` (ref `{base.ref}`) extracted into a" in md
    for text in (md, opts.out.read_text()):  # no path of this machine in the results
        assert str(REPO) not in text
        assert base.folder not in text
    assert not opts.chart_path.exists()


def _leaves(x: object) -> list[object]:
    if isinstance(x, dict):
        return [v for item in x.values() for v in _leaves(item)]
    if isinstance(x, list):
        return [v for item in x for v in _leaves(item)]
    return [x]
