"""The learned policy over real sockets: the gateway learns the simulators' curves and their
speculative acceptance, shows them, counts SLO outcomes, follows an acceptance shift and finds
an acceptance that came back."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.routing.types import Reason
from tests.integration.stack import MODEL, Stack, start_stack, wait_until
from tests.integration.test_gateway import families, total

# Bounds on time and placement: run after the parallel tests, alone (scripts/test).
pytestmark = pytest.mark.serial

BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 96,
                        "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}  # fmt: skip
V4_LOW = [0.45, 0.35, 0.3, 0.25, 0.2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("learned"), speedup=10,
                    policy={"name": "learned"})  # fmt: skip
    yield s
    s.stop()


def _wave(gw: str, n: int, headers: dict[str, str] | None = None) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            return list(
                await asyncio.gather(
                    *(c.post(gw + "/v1/completions", json=BODY, headers=headers) for _ in range(n))
                )
            )

    return asyncio.run(run())


def _models(gw: str) -> dict[str, dict[str, Any]]:
    return {b["url"]: b["model"] for b in httpx.get(gw + "/state").json()["backends"]}


def test_state_shows_the_learned_curves_and_acceptance(stack: Stack) -> None:
    gw = stack.gateway.url
    # At 10x the latency tier beats the throughput prior everywhere: pin some work there too.
    for n, pin in ((8, None), (24, None), (40, None), (16, "throughput")):
        responses = _wave(gw, n, {"x-tiergate-tier": pin} if pin else None)
        assert all(r.status_code == 200 for r in responses)
        assert all(r.text.endswith("data: [DONE]\n\n") for r in responses)
    state = httpx.get(gw + "/state").json()
    assert state["policy"] == "learned"
    assert (state["slo_ttft_ms"], state["slo_tpot_ms"]) == (1000, 25)
    models = _models(gw)
    lat = models[stack.latency[0].url]
    # v4 accepts [0.8, 0.75, 0.7, 0.65, 0.6]: 3.26 tokens per step, 45% of drafts.
    assert lat["tokens_per_step"] == pytest.approx(3.26, rel=0.15)
    assert lat["acceptance_rate"] == pytest.approx(0.452, rel=0.15)
    for sim in stack.throughput:
        assert models[sim.url]["tokens_per_step"] == 1.0
        assert models[sim.url]["acceptance_rate"] is None
    for model in models.values():
        curve = model["curve"]
        assert [p["concurrency"] for p in curve] == [1, 8, 16, 24, 32, 48, 64]
        tpots = [p["tpot_ms"] for p in curve]
        assert tpots == sorted(tpots)  # non-decreasing in concurrency
        assert sum(p["evidence"] for p in curve) > 0  # learned from observations
        assert 0 <= model["observed_ago_s"] < 10
        assert model["prefill_ms_per_1k_tokens"] >= 0  # shown (0 until prefill varies at a load)
        # The frontier: the most streams seen there (the waves put several at once on each).
        assert 1 <= model["frontier"] <= 40
        assert 0 < model["spread"] < 1
        for p in curve:  # the step time TPOT comes from: TPOT x tokens per step
            assert p["step_ms"] == pytest.approx(p["tpot_ms"] * model["tokens_per_step"], rel=0.01)
    # Ten times faster engines: v4's TPOT is ~0.6 ms alone, ~2 ms at 40 streams; v3's ~1.4 ms
    # (more on this shared CPU: 2.5 ms per token is a v4 that is not ten times faster).
    assert lat["curve"][0]["tpot_ms"] < 2.5
    assert lat["curve"][0]["tpot_ms"] < models[stack.throughput[0].url]["curve"][0]["tpot_ms"]
    assert lat["slo_limit"] >= 16  # at 10x, far more than 16 streams meet 25 ms


def test_metrics_show_predictions_limits_and_slo_outcomes(stack: Stack) -> None:
    gw = stack.gateway.url
    _wave(gw, 4, {"x-tiergate-slo-tpot-ms": "12"})
    _wave(gw, 4, {"x-tiergate-slo-tpot-ms": "0.01", "x-tiergate-slo-ttft-ms": "5000"})
    fams = families(gw)
    lat = stack.latency[0].url
    for n in ("1", "16", "64"):
        assert total(fams, "tiergate_backend_predicted_tpot_seconds", backend=lat,
                     concurrency=n) > 0  # fmt: skip
    assert total(fams, "tiergate_latency_tier_limit", backend=lat) >= 16
    met12 = total(fams, "tiergate_slo_met", "tiergate_slo_met_total", slo="tpot<=12ms")
    assert met12 >= 4  # 10x engines meet 12 ms easily
    missed = total(fams, "tiergate_slo_missed", "tiergate_slo_missed_total", slo="tpot<=5ms")
    assert missed >= 4  # nobody streams at 10 us per token

    def predicted() -> float:
        # A fresh gateway's first requests go past what it has seen of its backends (reason
        # `frontier`); once it has seen the loads they ask for, it decides by its predictions.
        _wave(gw, 4)
        return total(families(gw), "tiergate_routing_decisions",
                     "tiergate_routing_decisions_total", policy="learned",
                     reason="predicted_slo_met")  # fmt: skip

    wait_until(predicted, "a decision by a prediction", timeout_s=30, every=0.1)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-tiergate-slo-tpot-ms", "fast"),
        ("x-tiergate-slo-tpot-ms", "0"),
        ("x-tiergate-slo-ttft-ms", "-5"),
        ("x-tiergate-slo-ttft-ms", "nan"),
        ("x-tiergate-slo-ttft-ms", "1e12"),
    ],
)
def test_bad_slo_headers_get_a_clear_400(stack: Stack, header: str, value: str) -> None:
    body = {"model": MODEL, "prompt": "one", "max_tokens": 4}
    r = httpx.post(stack.gateway.url + "/v1/completions", json=body, headers={header: value})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == header
    assert "milliseconds" in err["message"]


def test_an_acceptance_drop_is_seen_and_the_curve_moves(stack: Stack) -> None:
    gw, lat = stack.gateway.url, stack.latency[0].url
    pin = {"x-tiergate-tier": "latency"}
    for _ in range(3):
        _wave(gw, 8, pin)
    before = _models(gw)[lat]
    assert before["tokens_per_step"] > 2.5
    assert before["curve"][0]["evidence"] > 0 or before["curve"][1]["evidence"] > 0
    r = httpx.post(lat + "/sim/speculative", json={"acceptance": V4_LOW})
    assert r.status_code == 200

    def dropped() -> bool:
        _wave(gw, 8, pin)
        return bool(_models(gw)[lat]["tokens_per_step"] < 2.0)

    assert wait_until(dropped, "the learned tokens per step below 2", timeout_s=30, every=0.2)
    after = _models(gw)[lat]
    # v4-low's vector: 1.67 tokens per step; the TPOT curve scales up with 3.26 / 1.67.
    assert after["tokens_per_step"] == pytest.approx(1.67, rel=0.2)
    assert after["curve"][1]["tpot_ms"] > 1.3 * before["curve"][1]["tpot_ms"]  # at 8 streams
    httpx.post(lat + "/sim/speculative", json={"scale": 1.0})
    time.sleep(0.1)


def _to_latency(gw: str, *reasons: str) -> float:
    """The gateway's routing decisions to the latency tier for any of `reasons`."""
    fams = families(gw)
    family = "tiergate_routing_decisions"
    return sum(total(fams, family, family + "_total", tier="latency", reason=r) for r in reasons)


def test_drafts_accepted_again_are_found_without_the_exploration_draw(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """EAGLE's drafts all rejected: the engine is slower than the pool, one request at a time
    goes to the pool, and nothing more is observed there. Accepted again: with an exploration
    rate too small ever to be drawn, the gateway tries the engine again once it has gone
    `explore_after_s` unobserved (the clock for engines that decode speculatively), sees its
    acceptance back, and sends it requests of its own choice again."""
    s = start_stack(tmp_path_factory.mktemp("recovery"), latency=1, throughput=1, speedup=10,
                    policy={"name": "learned", "explore_rate": 1e-9,
                            "explore_after_s": 1.0})  # fmt: skip
    try:
        gw, lat = s.gateway.url, s.latency[0].url
        for tier in ("latency", "throughput", "latency", "throughput"):
            _wave(gw, 4, {"x-tiergate-tier": tier})

        def chosen() -> float:
            """Requests the policy itself sent to the latency tier (not pinned, not tried)."""
            return _to_latency(gw, Reason.PREDICTED_SLO_MET, Reason.FRONTIER, Reason.HEADROOM)

        assert httpx.post(lat + "/sim/speculative", json={"acceptance": [0.0] * 5}).is_success

        def rejected() -> bool:
            _wave(gw, 4, {"x-tiergate-tier": "latency"})
            return bool(_models(gw)[lat]["tokens_per_step"] < 1.2)

        wait_until(rejected, "the learned tokens per step near 1", timeout_s=30, every=0.2)

        serial = itertools.count()

        def one() -> None:
            """A request of its own (a prompt not seen before: no home to go back to)."""
            body = BODY | {"prompt": f"{BODY['prompt']} {next(serial)}"}
            assert httpx.post(gw + "/v1/completions", json=body, timeout=60).is_success

        def left() -> bool:
            before = chosen()
            for _ in range(4):
                one()
            return chosen() == before

        wait_until(left, "four requests in a row the policy kept off the latency tier",
                   timeout_s=30, every=0.1)  # fmt: skip
        tried = _to_latency(gw, Reason.EXPLORE)

        def tried_again() -> bool:
            one()
            return _to_latency(gw, Reason.EXPLORE) > tried

        # Unobserved, the engine is tried on the clock (no draw at this rate ever would) ...
        wait_until(tried_again, "the latency engine tried again", timeout_s=30, every=0.05)
        assert httpx.post(lat + "/sim/speculative", json={"scale": 1.0}).is_success
        before = chosen()

        def back() -> bool:
            one()
            return chosen() > before and _models(gw)[lat]["tokens_per_step"] > 2.5

        # ... so that once its drafts are accepted again, the policy finds it and uses it.
        wait_until(back, "the policy sending requests to the latency tier again", timeout_s=30,
                   every=0.05)  # fmt: skip
    finally:
        s.stop()


def test_admission_works_on_predictions(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A backend predicted to answer the first token later than twice the request's TTFT SLO
    is full: the request waits for the queue deadline, then gets 429."""
    s = start_stack(tmp_path_factory.mktemp("admission"), latency=1, throughput=1, speedup=10,
                    policy={"name": "learned", "queue_deadline_s": 0.3})  # fmt: skip
    try:
        gw = s.gateway.url
        _wave(gw, 8)  # TTFT at 10x: tens of ms, learned at both backends' loads
        _wave(gw, 8, {"x-tiergate-tier": "throughput"})
        t0 = time.perf_counter()
        r = httpx.post(gw + "/v1/completions", json=BODY, headers={"x-tiergate-slo-ttft-ms": "2"})
        waited = time.perf_counter() - t0
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "RateLimitError"
        assert waited >= 0.3
        # the same request with an SLO the backends can meet goes through
        ok = httpx.post(
            gw + "/v1/completions", json=BODY, headers={"x-tiergate-slo-ttft-ms": "900"}
        )
        assert ok.status_code == 200
        fams = families(gw)
        assert total(fams, "tiergate_rejected", "tiergate_rejected_total", reason="saturated") >= 1
    finally:
        s.stop()
