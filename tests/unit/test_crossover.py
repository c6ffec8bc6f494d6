"""The crossover benchmark's pure parts: where two TPOT curves cross, the golden-range limits and
SLO limits read off them, the engines' order per level, the window throughput and the report's
command line."""

from __future__ import annotations

import math

import pytest
import yaml

from gateway.config.settings import PolicyConfig
from gateway.routing import PolicyParams
from loadtests.common.report import command_line
from loadtests.crossover import (
    Crossing,
    Window,
    active_window,
    base_url,
    crossover_text,
    engine_order,
    first_crossing,
    limit_below,
    policy_snippet,
    recommend,
    slo_limit,
    window,
)
from loadtests.harness.client import Result

NAN = math.nan
LEVELS = (1, 2, 4, 8)


@pytest.mark.parametrize(
    ("levels", "a", "b", "want"),
    [
        # below, below, then above: linear between 2 (-4) and 4 (+1): 2 + 2 * 4/5
        (LEVELS[:3], [5, 6, 9], [10, 10, 8], Crossing("crossed", 3.6, 1, 4)),
        # reaching b exactly at a level crosses there
        ((1, 16), [5, 7], [7, 7], Crossing("crossed", 16.0, 1, 16)),
        ((1, 16, 32), [5, 6, 8], [7, 7, 8], Crossing("crossed", 32.0, 1, 32)),
        # below everywhere: never; not below at the lowest: from the start
        (LEVELS, [1, 2, 3, 4], [9, 9, 9, 9], Crossing("never", None, 1, 8)),
        (LEVELS, [9, 1, 1, 1], [5, 5, 5, 5], Crossing("from-start", None, 1, 8)),
        (LEVELS, [5, 1, 1, 1], [5, 5, 5, 5], Crossing("from-start", None, 1, 8)),
        # a level missing on either side is skipped: 1 (-5) to 4 (+1) -> 1 + 3 * 5/6
        (LEVELS[:3], [5, NAN, 9], [10, 10, 8], Crossing("crossed", 3.5, 1, 4)),
        (LEVELS, [5, 6, 9, 1], [10, NAN, 8, NAN], Crossing("crossed", 3.5, 1, 4)),
        (LEVELS, [NAN, 1, 2, 3], [9, 9, 9, NAN], Crossing("never", None, 2, 4)),
        # not monotone: the lowest crossing counts, even if a is below again later
        (LEVELS, [1, 3, 1, 3], [2, 2, 2, 2], Crossing("crossed", 1.5, 1, 8)),
        (LEVELS, [NAN] * 4, [1] * 4, Crossing("unmeasured")),
        ((), [], [], Crossing("unmeasured")),
    ],
)
def test_first_crossing(
    levels: tuple[int, ...], a: list[float], b: list[float], want: Crossing
) -> None:
    got = first_crossing(levels, a, b)
    assert (got.side, got.lowest, got.highest) == (want.side, want.lowest, want.highest)
    assert got.at == pytest.approx(want.at)


@pytest.mark.parametrize(
    ("crossing", "want"),
    [
        (Crossing("crossed", 35.4, 1, 64), 35),
        (Crossing("crossed", 16.0, 1, 64), 15),  # equal at 16: strictly below only up to 15
        (Crossing("crossed", 1.2, 1, 64), 1),
        (Crossing("crossed", 1.0, 1, 64), 1),  # at least 1
        (Crossing("never", None, 1, 64), 64),  # below throughout: the highest level measured
        (Crossing("from-start", None, 1, 64), 1),
        (Crossing("from-start", None, 8, 64), 1),
    ],
)
def test_limit_below(crossing: Crossing, want: int) -> None:
    assert limit_below(crossing) == want


# Curves shaped like the stock simulator profiles (ms): v4 wins small batches, v3 large ones.
C9 = (1, 2, 4, 8, 16, 24, 32, 48, 64)
V4 = [6.0, 6.1, 6.2, 6.5, 7.0, 9.0, 17.0, 26.0, 36.0]
V3 = [13.7, 13.8, 14.0, 14.4, 15.2, 16.0, 18.0, 23.6, 29.0]


@pytest.mark.parametrize(
    ("latency", "throughput", "golden", "cap", "clamped", "side"),
    [
        # crossover between 32 (-1) and 48 (+2.4): 32 + 16/3.4 = 36.7 -> 36; the cap where v4
        # reaches v3's 29.0 at 64: between 48 (26) and 64 (36): 48 + 16 * 3/10 = 52.8 -> 52
        (V4, V3, 36, 52, False, "crossed"),
        # latency faster everywhere: both limits are the highest level measured
        ([5.0] * 9, [9.0] * 9, 64, 64, False, "never"),
        # no faster even at 1: the smallest golden range; the cap still where it beats a
        # saturated pool (v4 reaches 29 between 48 (26) and 64 (36): 52)
        ([14.0, *V4[1:]], [13.0, *V3[1:]], 1, 52, False, "from-start"),
        ([20.0] * 9, [10.0] * 9, 1, 1, False, "from-start"),
        # the throughput engine faster at its top than in the middle (noise): equal at 48, so
        # the golden range ends at 47; the latency engine reaches the top's 8 ms at 8 already,
        # so the cap (7) would fall below the golden range and is raised to it
        ([5, 6, 7, 8, 9, 10, 11, 12, 13], [9, 9, 9, 9, 12, 12, 12, 12, 8], 47, 47, True,
         "crossed"),
    ],
)  # fmt: skip
def test_recommend(
    latency: list[float], throughput: list[float], golden: int, cap: int, clamped: bool, side: str
) -> None:
    rec = recommend(C9, latency, throughput)
    assert rec is not None
    assert rec.crossover.side == side
    assert (rec.params.latency_max_concurrency, rec.params.latency_hard_cap) == (golden, cap)
    assert rec.clamped is clamped
    assert rec.saturated_level == 64
    assert rec.saturated_tpot == throughput[-1]


def test_recommend_reads_the_saturated_pool_at_its_highest_measured_level() -> None:
    rec = recommend(C9, V4, [*V3[:-1], NAN])  # nothing measured at 64
    assert rec is not None
    assert (rec.saturated_level, rec.saturated_tpot) == (48, 23.6)
    # v4 reaches 23.6 between 32 (17) and 48 (26): 32 + 16 * 6.6/9 = 43.7 -> 43
    assert rec.params.latency_hard_cap == 43
    assert recommend(C9, [NAN] * 9, V3) is None
    assert recommend(C9, V4, [NAN] * 9) is None


@pytest.mark.parametrize("golden", [1, 2, 3, 4, 36])
def test_recommended_params_always_validate(golden: int) -> None:
    """A golden range at or below the default hysteresis would be rejected by the gateway: the
    recommendation then sets hysteresis just below it, and only then."""
    # latency TPOT = concurrency; throughput TPOT flat at golden + 0.5: they cross there
    flat = golden + 0.5
    rec = recommend((1, 100), [1.0, 100.0], [flat, flat])
    assert rec is not None
    assert rec.crossover.at == pytest.approx(flat)
    assert rec.params.latency_max_concurrency == golden
    assert rec.params.latency_hard_cap == golden
    assert rec.params.hysteresis < golden
    resized = PolicyParams().hysteresis >= golden
    assert ("hysteresis" in rec.params.model_fields_set) is resized
    if not resized:
        assert rec.params.hysteresis == PolicyParams().hysteresis
    snippet = yaml.safe_load(policy_snippet(rec.params))["policy"]
    PolicyConfig(**snippet)  # the gateway's own settings accept the block


@pytest.mark.parametrize("golden", [1, 2, 3, 16, 35])
def test_policy_snippet_sets_what_was_recommended(golden: int) -> None:
    params = PolicyParams(
        latency_max_concurrency=golden,
        latency_hard_cap=golden + 10,
        **({"hysteresis": golden - 1} if golden <= PolicyParams().hysteresis else {}),
    )
    text = policy_snippet(params)
    block = yaml.safe_load(text)["policy"]
    assert block["name"] == "golden-range"
    assert PolicyConfig(**block) == PolicyConfig(name="golden-range", **params.model_dump())
    assert set(block) - {"name"} == params.model_fields_set
    defaults = PolicyParams()
    for name in params.model_fields_set:
        assert f"{name}: {getattr(params, name)}  # default {getattr(defaults, name)}" in text


@pytest.mark.parametrize(
    ("tpot", "slo", "limit", "beyond", "text"),
    [
        (V4, 12.0, 27, False, "27"),  # 24 (9) to 32 (17): 24 + 8 * 3/8 = 27
        (V4, 25.0, 46, False, "46"),  # 32 (17) to 48 (26): 32 + 16 * 8/9 = 46.2
        (V3, 12.0, 0, False, "none"),
        (V3, 25.0, 52, False, "52"),  # 48 (23.6) to 64 (29): 48 + 16 * 1.4/5.4 = 52.1
        (V3, 30.0, 64, True, ">= 64"),
        ([NAN, 20.0, 30.0, 40.0], 10.0, 0, False, "< 2"),
    ],
)
def test_slo_limit(tpot: list[float], slo: float, limit: int, beyond: bool, text: str) -> None:
    levels = C9[: len(tpot)] if len(tpot) < len(C9) else C9
    got = slo_limit(levels, tpot, slo)
    crossing = first_crossing(levels, tpot, [slo] * len(levels))
    if crossing.side == "crossed":
        assert crossing.at is not None
        assert got.limit == math.floor(crossing.at)
    assert (got.limit, got.beyond, got.text()) == (limit, beyond, text)


@pytest.mark.parametrize(
    ("index", "first"),
    [(0, "latency"), (1, "throughput"), (2, "latency"), (7, "throughput")],
)
def test_engine_order_alternates(index: int, first: str) -> None:
    order = engine_order(index)
    assert order[0] == first
    assert sorted(order) == ["latency", "throughput"]


@pytest.mark.parametrize(
    ("crossing", "words"),
    [
        (Crossing("crossed", 35.4, 1, 64), "35.4 concurrent requests"),
        (Crossing("never", None, 1, 64), "latency engine is faster per token at every level up "
         "to 64"),
        (Crossing("from-start", None, 2, 64), "throughput engine is as fast or faster per token "
         "already at 2"),
        (Crossing("unmeasured"), "not measured"),
    ],
)  # fmt: skip
def test_crossover_text_says_which_way(crossing: Crossing, words: str) -> None:
    assert words in crossover_text(crossing)


def _result(user: int, index: int, sent: float, chunks: list[tuple[float, int]],
            tokens: int) -> Result:  # fmt: skip
    r = Result(user, index, sent, status=200, tokens=tokens, chunks=chunks)
    r.ttft, r.e2e = chunks[0][0] - sent, chunks[-1][0] - sent
    return r


@pytest.mark.parametrize(
    ("results", "tok_s", "span"),
    [
        # two users of 2 requests each; every user active from 2.0 (user 1's first ends) to
        # 3.0 (user 0's last ends): the chunks at 2.5 and 3.0, 1 + 1 words = tokens
        ([_result(0, 1, 0.0, [(0.5, 1), (1.0, 1)], 2),
          _result(0, 2, 1.0, [(2.5, 1), (3.0, 1)], 2),
          _result(1, 1, 0.5, [(1.5, 1), (2.0, 1)], 2),
          _result(1, 2, 2.0, [(3.5, 1), (4.0, 1)], 2)], 2.0, 1.0),
        # users with different counts: window from 2.0 to min(user 0 ends 5.0, user 1 ends 4.0);
        # chunks in (2, 4]: 2.5, 3.0, 3.5, 4.0 -> 4 words over 2 s
        ([_result(0, 1, 0.0, [(0.5, 1), (1.0, 1)], 2),
          _result(0, 2, 1.0, [(2.5, 1), (3.0, 1)], 2),
          _result(0, 3, 3.0, [(4.5, 1), (5.0, 1)], 2),
          _result(1, 1, 0.5, [(1.5, 1), (2.0, 1)], 2),
          _result(1, 2, 2.0, [(3.5, 1), (4.0, 1)], 2)], 2.0, 2.0),
        # a real engine's chunk words are not tokens: 2 words that usage says were 6 tokens
        # count as 3 tokens each
        ([_result(0, 1, 0.0, [(1.0, 1)], 1),
          _result(0, 2, 1.0, [(1.5, 1), (2.0, 1)], 6)], 6.0, 1.0),
        # no window in which everyone is active
        ([_result(0, 1, 0.0, [(1.0, 1)], 1), _result(1, 1, 2.0, [(3.0, 1)], 1)], NAN, 0.0),
        ([], NAN, 0.0),
    ],
)  # fmt: skip
def test_active_window(results: list[Result], tok_s: float, span: float) -> None:
    got_tok_s, got_span = active_window(results)
    assert got_span == pytest.approx(span)
    if math.isnan(tok_s):
        assert math.isnan(got_tok_s)
    else:
        assert got_tok_s == pytest.approx(tok_s)


# Two users, user 1 starting 0.5 s later: user 0 sends at 0, 1, 3 (ends 1, 3, 5), user 1 at
# 0.5, 2 (ends 2, 4). Every user in flight from 0.5 (both sent) / 2.0 (both past their first)
# to 4.0 (user 1 done).
TWO_USERS = [
    _result(0, 1, 0.0, [(0.5, 1), (1.0, 1)], 2),
    _result(0, 2, 1.0, [(2.5, 1), (3.0, 1)], 2),
    _result(0, 3, 3.0, [(4.5, 1), (5.0, 1)], 2),
    _result(1, 1, 0.5, [(1.5, 1), (2.0, 1)], 2),
    _result(1, 2, 2.0, [(3.5, 1), (4.0, 1)], 2),
]


def test_window_bounds() -> None:
    assert window(TWO_USERS) == Window(all_sent=0.5, start=2.0, end=4.0)
    assert window([]) is None


@pytest.mark.parametrize(
    ("result", "measured"),
    [
        (TWO_USERS[0], False),  # a warm-up request
        (TWO_USERS[3], False),  # the late user's warm-up
        (TWO_USERS[1], True),  # sent at 1.0, after both users started; done at 3.0
        (TWO_USERS[4], True),  # done at 4.0: the end of the window itself
        (TWO_USERS[2], False),  # done at 5.0, after user 1 had stopped: lower load
        (_result(0, 2, 0.2, [(1.0, 1)], 1), False),  # sent before user 1 started
        (Result(0, 2, 1.0, status=500, error="boom"), False),  # failed
    ],
)
def test_measured_requests_ran_at_full_concurrency(result: Result, measured: bool) -> None:
    w = window(TWO_USERS)
    assert w is not None
    assert w.measured(result) is measured


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["bench", "crossover", "--latency", "http://a:1", "--api-key", "s3cret"],
         "tiergate bench crossover --latency http://a:1 --api-key '***'"),
        (["bench", "crossover", "--api-key=s3cret", "--note", "two words"],
         "tiergate bench crossover '--api-key=***' --note 'two words'"),
        (["bench", "crossover"], "tiergate bench crossover"),
    ],
)  # fmt: skip
def test_command_line_masks_the_key(argv: list[str], want: str) -> None:
    assert command_line(argv) == want
    assert "s3cret" not in command_line(argv)


@pytest.mark.parametrize(
    "url",
    ["http://gpu-a:8000", "http://gpu-a:8000/", "http://gpu-a:8000/v1", "http://gpu-a:8000/v1/"],
)
def test_base_url(url: str) -> None:
    assert base_url(url) == "http://gpu-a:8000"
