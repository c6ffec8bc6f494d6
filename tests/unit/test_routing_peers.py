"""The peer routers in the routing benchmark, without running them: how a ROUTER:POLICY spec is
read, how their tier split is taken from the engines' counters, and how their SLO-met counts
are judged against tiergate's policies with the counting noise."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from loadtests.harness.client import Result
from loadtests.harness.peerenv import PEERS, litellm_config, scrub
from loadtests.harness.phases import PhaseStats, Slo, phase_stats
from loadtests.routing import (
    PEER_POLICIES,
    _engine_split,
    _error_lines,
    _round_lines,
    _tiers,
    peer_spec,
    peer_verdicts,
)


def test_peer_specs_name_a_router_and_one_of_its_policies() -> None:
    assert [peer_spec(s) for s in PEER_POLICIES] == [
        ("vllm-router", "power_of_two"), ("vllm-router", "cache_aware"),
        ("smg", "cache_aware"), ("smg", "power_of_two"),
    ]  # fmt: skip
    for bad in ("litellm:round_robin", "vllm-router", "smg:least_loaded", "nginx:cache_aware"):
        with pytest.raises(ValueError, match="ROUTER:POLICY"):
            peer_spec(bad)


def _phase(i: int, requests: int) -> PhaseStats:
    nan = math.nan
    return PhaseStats(i, 1, 1.0, requests, 0, nan, nan, nan, nan, 0.0, 0.0, {"none": requests})


def test_a_peers_tier_split_is_the_engines_counter_differences_summed_over_runs() -> None:
    # Snapshots (latency, throughput) as each of two phases starts, and after the run.
    runs = [[(10, 100), (12, 130), (20, 150)], [(0, 0), (1, 5), (1, 9)]]
    out = _engine_split([_phase(0, 33), _phase(1, 28)], runs)
    assert [s.by_tier for s in out] == [
        {"latency": 3, "throughput": 35}, {"latency": 8, "throughput": 24}
    ]  # fmt: skip
    assert [s.requests for s in out] == [33, 28]  # the client's own counts are kept
    assert [_tiers(s.by_tier) for s in out] == ["3:35", "8:24"]
    assert _tiers({"none": 5}) == "-"  # a router without a tier header, before the split


def test_tiergate_policies_against_each_peer_with_the_counting_noise() -> None:
    met = {"learned": 500, "golden-range": 400, "smg:cache_aware": 300,
           "vllm-router:power_of_two": 450, "limit-8": 520}  # fmt: skip
    got = {(v["policy"], v["peer"]): v for v in peer_verdicts(met)}
    assert set(got) == {(p, q) for p in ("learned", "golden-range")
                        for q in ("smg:cache_aware", "vllm-router:power_of_two")}  # fmt: skip
    v = got[("learned", "smg:cache_aware")]
    assert v["noise"] == round(2 * math.sqrt(800), 1)
    assert v["text"] == "higher"  # 200 apart, noise 56.6
    assert got[("learned", "vllm-router:power_of_two")]["text"] == "within noise"  # 50 < 61.6
    assert got[("golden-range", "vllm-router:power_of_two")]["text"] == "within noise"
    assert got[("golden-range", "smg:cache_aware")]["text"] == "higher"
    assert peer_verdicts({"learned": 10, "smg:cache_aware": 90})[0]["text"] == "LOWER"
    assert peer_verdicts({"learned": 10, "golden-range": 12}) == []  # no peer ran


@pytest.mark.parametrize(
    ("rounds", "want"),
    [
        # One round: no spread to show.
        ({"learned": [800], "smg:power_of_two": [600]}, []),
        # learned against each other policy, round by round, in the order run.
        ({"learned": [820, 780], "golden-range": [800, 800], "smg:power_of_two": [410, 0]},
         ["SLO-met per round (in the order run, the policies' order rotating): "
          "learned 820 / 780; golden-range 800 / 800; smg:power_of_two 410 / 0",
          "learned / golden-range per round: 1.02x, 0.97x",
          "learned / smg:power_of_two per round: 2.00x, inf"]),
        # Without learned, golden-range is the one compared.
        ({"golden-range": [300, 330], "vllm-router:power_of_two": [200, 300]},
         ["SLO-met per round (in the order run, the policies' order rotating): "
          "golden-range 300 / 330; vllm-router:power_of_two 200 / 300",
          "golden-range / vllm-router:power_of_two per round: 1.50x, 1.10x"]),
    ],
)  # fmt: skip
def test_each_rounds_count_and_ratio_are_reported(
    rounds: dict[str, list[int]], want: list[str]
) -> None:
    whole = {p: {"slo_met": sum(r), "goodput": 1.0, "per_round": r} for p, r in rounds.items()}
    assert _round_lines(whole) == want


@pytest.mark.parametrize(
    ("status", "error", "want"),
    [
        (200, None, None),
        (429, '{"error": {"message": "no backend has room", "type": "overloaded"}}', "HTTP 429"),
        (503, None, "HTTP 503"),
        (0, "TimeoutError: ", "TimeoutError"),
        (0, "ClientPayloadError: Response payload is not completed", "ClientPayloadError"),
        (200, '{"message": "the stream ended before [DONE]", "type": "upstream_error"}',
         "stream error upstream_error"),
        (200, '{"message": "x", "code": 502}', "stream error 502"),
        (200, '{"message": "x"}', "stream error"),
        (200, "", "unknown"),
    ],
)  # fmt: skip
def test_a_failed_request_is_counted_by_its_kind(status: int, error: str | None,
                                                 want: str | None) -> None:  # fmt: skip
    assert Result(0, 1, 0.0, status=status, error=error).error_kind == want


def test_each_policys_errors_are_listed_by_phase_and_kind() -> None:
    ok = Result(0, 1, 0.0, status=200, ttft=0.1, e2e=0.2, tokens=3)
    late = Result(1, 1, 0.0, status=429, error="full", e2e=1.5)
    cut = Result(2, 1, 0.0, status=200, error="TimeoutError: ", e2e=1.6)
    stats = phase_stats([([ok, late, cut], [0.0, 1.0, 2.0])], (1, 8), Slo())
    assert [s.errors_by_kind for s in stats] == [{}, {"HTTP 429": 1, "TimeoutError": 1}]
    data = {"policies": {"learned": [dataclasses.asdict(s) for s in stats],
                         "golden-range": [dataclasses.asdict(stats[0])]}}  # fmt: skip
    assert _error_lines(data) == ["errors, learned: phase 2 HTTP 429 x 1, phase 2 TimeoutError x 1"]


def test_litellm_spreads_over_every_worker_under_one_model_name() -> None:
    config = litellm_config(["http://127.0.0.1:1", "http://127.0.0.1:2"], "m/x")
    assert config == {"model_list": [
        {"model_name": "m/x", "litellm_params": {"model": "hosted_vllm/m/x",
                                                 "api_base": "http://127.0.0.1:1/v1"}},
        {"model_name": "m/x", "litellm_params": {"model": "hosted_vllm/m/x",
                                                 "api_base": "http://127.0.0.1:2/v1"}},
    ]}  # fmt: skip
    assert not PEERS["litellm"].policies


def test_reports_name_no_folder_of_this_machine() -> None:
    venv = Path("/srv/cache/peers-venv")
    text = f"exited with 1: Traceback in {venv}/lib/python3.11/site-packages/x.py, {Path.home()}/a"
    assert scrub(text, venv) == (
        "exited with 1: Traceback in <peers-venv>/lib/python3.11/site-packages/x.py, ~/a"
    )
