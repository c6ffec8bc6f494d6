"""The overhead benchmark end to end with tiny settings, against real processes: the report is
complete and consistent with itself. Nothing here judges speed."""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.nginx import nginx_binary
from loadtests.overhead import PROXIES, Options, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_overhead_report_is_complete_and_consistent(tmp_path: Path) -> None:
    wrk = shutil.which("wrk") is not None
    opts = Options(
        duration_s=0.3,
        rounds=1,
        rate=50,
        wrk_seconds=1 if wrk else 0,
        out=tmp_path / "overhead.json",
        chart=False,  # importing matplotlib alone takes seconds; the real run draws it
        command="tiergate bench overhead (smoke)",
    )
    report = run(opts, Console(file=io.StringIO(), width=200))

    expected = [n for n in ("direct", "nginx", "gateway") if n != "nginx" or nginx_binary()]
    assert report.targets == expected
    for cells, conns in ((report.latency, (1, 64, 256)), (report.ttft, (1, 64))):
        assert [c.concurrency for c in cells] == list(conns)
        for cell in cells:
            assert list(cell.stats) == expected
            for s in cell.stats.values():
                assert s.n > 0
                assert s.errors == 0
                assert 0 < s.p50_ms <= s.p99_ms
            assert sorted(cell.added) == sorted(n for n in expected if n in PROXIES)
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

    data = json.loads(opts.out.read_text())
    assert data["targets"] == expected
    assert data["nproc"] >= 1
    assert len(data["latency"]) == 3
    assert len(data["ttft"]) == 2
    assert not any(isinstance(v, float) and math.isnan(v) for v in _leaves(data))
    md = opts.markdown_path.read_text()
    assert "tiergate bench overhead (smoke)" in md
    assert "## Verdicts" in md
    assert not opts.chart_path.exists()


def _leaves(x: object) -> list[object]:
    if isinstance(x, dict):
        return [v for item in x.values() for v in _leaves(item)]
    if isinstance(x, list):
        return [v for item in x for v in _leaves(item)]
    return [x]
