"""What `tiergate bench conversations` reads of an engine's per-request TPOT histogram
(loadtests.conversations.tally): finished requests, those within the SLO, their TPOTs' sum."""

from __future__ import annotations

import pytest

from loadtests.conversations import TPOT, tally

PAGE = f"""# HELP {TPOT} Histogram of time_per_output_token_seconds per request.
# TYPE {TPOT} histogram
{TPOT}_bucket{{le="0.01",model_name="m"}} 2.0
{TPOT}_bucket{{le="0.025",model_name="m"}} 7.0
{TPOT}_bucket{{le="0.05",model_name="m"}} 9.0
{TPOT}_bucket{{le="+Inf",model_name="m"}} 10.0
{TPOT}_count{{model_name="m"}} 10.0
{TPOT}_sum{{model_name="m"}} 0.21
# HELP vllm:num_requests_running Requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 3.0
"""


@pytest.mark.parametrize(
    ("case", "slo_s", "within"),
    [
        ("the SLO is a bucket's bound", 0.025, 7.0),
        ("between bounds: the bound below it", 0.03, 7.0),
        ("below every bound", 0.005, 0.0),
        ("the loosest bound", 0.05, 9.0),
        ("past every finite bound", 100.0, 9.0),
    ],
)
def test_requests_within_the_slo(case: str, slo_s: float, within: float) -> None:
    served, got, total = tally(PAGE, slo_s)
    assert (served, got) == (10.0, within), case
    assert total == pytest.approx(0.21)


def test_a_page_without_the_histogram_counts_nothing() -> None:
    assert tally('vllm:num_requests_running{model_name="m"} 3.0\n', 0.025) == (0.0, 0.0, 0.0)


def test_an_engine_serving_two_models_sums_them() -> None:
    two = PAGE + PAGE.split("# HELP vllm:num")[0].replace('model_name="m"', 'model_name="n"')
    served, within, total = tally(two.replace(f"# HELP {TPOT}", "# X", 1), 0.025)
    assert (served, within) == (20.0, 14.0)
    assert total == pytest.approx(0.42)
