"""The Triton translation benchmark end to end with tiny settings, against real processes: every
target answers every cell without errors, streams carry every token, and the report is
consistent with itself. Nothing here judges speed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.triton import DIRECT, TARGETS, Options, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_triton_bench_report_is_complete_and_consistent(tmp_path: Path) -> None:
    opts = Options(duration_s=0.3, rounds=1, rate=50, stream_tokens=16, out=tmp_path / "t.json",
                   command="tiergate bench triton (smoke)")  # fmt: skip
    report = run(opts, Console(file=io.StringIO(), width=200))

    # Triton sends one event (gRPC: one response) per token and no [DONE]; the gateway's OpenAI
    # stream adds the usage chunk and [DONE], exactly like vLLM's, over either protocol.
    assert report.events == {"vllm": 18, "gateway->vllm": 18, "triton": 16, "gateway->triton": 18,
                             "triton-grpc": 16, "gateway->triton-grpc": 18}  # fmt: skip
    assert [(c.kind, c.concurrency) for c in report.cells] == [
        ("small", 1), ("small", 64), ("stream", 1), ("stream", 16)]  # fmt: skip
    assert sum(v for c in report.cells for v in c.gateway_cpu_ms.values()) > 0
    for cell in report.cells:
        assert list(cell.stats) == list(TARGETS)
        for s in cell.stats.values():
            assert s.n > 0
            assert s.errors == 0
            assert 0 < s.p50_ms <= s.p99_ms
        for gw, direct in DIRECT.items():
            added = cell.added[gw]
            assert added.p50_ms == pytest.approx(cell.stats[gw].p50_ms - cell.stats[direct].p50_ms)
            # /proc counts CPU in ticks of 10 ms: a 0.3-s cell may see none.
            assert cell.gateway_cpu_ms[gw] >= 0
        assert cell.translation_p50_ms == pytest.approx(
            cell.added["gateway->triton"].p50_ms - cell.added["gateway->vllm"].p50_ms
        )
        assert cell.grpc_vs_http_p50 == pytest.approx(
            cell.stats["gateway->triton-grpc"].p50_ms / cell.stats["gateway->triton"].p50_ms
        )
    saved = json.loads(opts.out.read_text())
    assert len(saved["cells"]) == 4
    md = opts.markdown_path.read_text()
    assert md.count("## ") == 4
    assert "Translation:" in md
    assert md.count("gRPC / HTTP (gateway to Triton):") == 4
