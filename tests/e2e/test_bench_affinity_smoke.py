"""A seconds-long run of `tiergate bench affinity` with tiergate's two arms: the report has both,
and affinity serves more of the conversations' prompts from the engines' prefix caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.affinity import AFFINITY, BASE, Options, run

pytestmark = pytest.mark.e2e


def test_affinity_raises_the_prefix_cache_hit_rate(tmp_path: Path) -> None:
    # Short system prompt and replies, many turns: most of each prompt is the conversation's own
    # history, which only the instance that served its last turn holds. Without affinity about
    # five turns in six of a conversation land on an instance other than the last one on a pool
    # of six (least-loaded, ties broken at random), which holds an older part of it or none;
    # with it, every later turn finds its history where the last turn left it. (On a pool of
    # four, chance alone took the hit rate without affinity from 0.56 to 0.72 across runs on a
    # busy machine, against about 0.80 with it.)
    opts = Options(
        sims=6, users=8, turns=10, seconds=2, warmup_s=1, rounds=1, speedup=10, system_words=16,
        user_words=4, reply_tokens=8, think_s=0.05, arms=(BASE, AFFINITY),
        out=tmp_path / "affinity.json", chart=False, command="tiergate bench affinity (test)",
    )  # fmt: skip
    report = run(opts, Console(width=200))
    arms = report["arms"]
    assert set(arms) == {BASE, AFFINITY}
    for figs in arms.values():
        assert figs["samples"] > 20
        assert figs["errors"] == 0
        assert figs["ttft_p50_ms"] <= figs["ttft_p99_ms"]
        # the engines' counters and the usage the client saw agree
        assert figs["hit_rate"] == pytest.approx(figs["usage_rate"], abs=0.02)
        # the warm-up ran and was left out of the measured window, not of the figure from cold
        assert figs["warmup_requests"] > 0
        assert 0 < figs["hit_rate_cold"] <= 1
        assert 0 < figs["hit_rate_mix"] <= 1
        assert len(figs["by_turn"]) == opts.turns
    with_, without = arms[AFFINITY]["hit_rate"], arms[BASE]["hit_rate"]
    assert with_ > without + 0.1, (with_, without)
    assert 1 <= arms[AFFINITY]["peak"] <= opts.users
    hit = report["verdicts"][0]
    assert hit["goal"].startswith("hit rate")
    assert hit["result"] == "MET"
    assert json.loads((tmp_path / "affinity.json").read_text()) == report
    md = (tmp_path / "affinity.md").read_text()
    assert f"`{AFFINITY}`" in md
    assert "## Goals" in md
