"""The pure part of the HF measurement: turning token arrival times into TTFT/TPOT/E2E, and
medians over runs (the GPU part needs torch and a GPU, and is run by hand: engines/hf)."""

from __future__ import annotations

import pytest

from engines.hf.measure import Timing, summarize, timing


def test_timing_from_token_arrivals() -> None:
    # Called at 10.0; first token at 10.2, then one every 0.02 s: 5 tokens.
    t = timing(10.0, [10.2, 10.22, 10.24, 10.26, 10.28])
    assert t.ttft_s == pytest.approx(0.2)
    assert t.tpot_s == pytest.approx(0.02)
    assert t.e2e_s == pytest.approx(0.28)
    assert t.tokens == 5
    assert t.tok_s == pytest.approx(5 / 0.28)


def test_one_token_has_no_gaps_and_none_is_an_error() -> None:
    assert timing(0.0, [0.5]).tpot_s == 0.0
    with pytest.raises(ValueError, match="no tokens"):
        timing(0.0, [])


def test_summarize_takes_medians_and_units() -> None:
    runs = [Timing(0.1, 0.02, 5.0, 256), Timing(0.3, 0.04, 9.0, 256), Timing(0.2, 0.03, 7.0, 256)]
    r = summarize("eager", "eager", True, runs, 13_700_000_000, 6.2,
                  {"gpu": "g", "torch": "t", "transformers": "x"})  # fmt: skip
    assert (r.ttft_ms, r.tpot_ms, r.e2e_s) == (pytest.approx(200), pytest.approx(30), 7.0)
    assert r.tok_s == pytest.approx(256 / 7.0)
    assert r.peak_mem_gb == pytest.approx(13.7)
    assert r.runs == 3
