"""Every dashboard panel, recording rule and alert returns data from a live stack.

One v4 and two v3 simulators behind a gateway, a real Prometheus with the deployed scrape config
(loopback targets, 1 s intervals) and rule files, and a short step load with injected faults
(see loadtests/dashboards.py). Then, through Prometheus' HTTP API, at the end of the load:
- every panel target of every dashboard, variables at "All", `$__rate_interval` and `$__range`
  set to the whole load;
- every recording rule: its recorded series;
- every alert: its expression with the literal thresholds stripped (the signal it compares),
  since a healthy short run should not make most of them fire;
each must return at least one series with a finite value. Finally every dashboard is rendered
to PNG from `query_range`, as `tiergate bench dashboards` does. The demo runs the deployed
policy (golden-range); the same deployment and a shorter run of the same load with the `learned`
policy must fill the learned routing row too, and route by the model's predictions.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from gateway.routing import PolicyName
from loadtests.dashboards import (
    LoadLog,
    Window,
    drive,
    render,
    start_demo_stack,
    step_scenario,
    wait_targets_up,
)
from loadtests.harness.promstack import (
    NO_PROMETHEUS,
    PromClient,
    PrometheusProcess,
    Rule,
    Series,
    load_dashboards,
    load_rules,
    local_config,
    stack_targets,
    substitute,
    variable_options,
    variable_values,
)
from tests.integration.stack import wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason=NO_PROMETHEUS),
]

SPEEDUP = 2.0
LOAD_SECONDS = 14.0
# The learned row's panels are gauges and rates over the whole run, and both SLO classes are
# asked from the first phase on: every phase of the step load, shorter, still fills them.
LEARNED_LOAD_SECONDS = 8.0
DASHBOARDS = tuple(load_dashboards())
PANEL_QUERIES = tuple(
    pytest.param(board.name, panel.title, target.expr, target.legend,
                 id=f"{board.name}/{panel.title}/{target.ref_id}")
    for board in DASHBOARDS for panel, target in board.queries()
)  # fmt: skip
LEARNED_ROW = "Learned routing"
RULES = tuple(load_rules())


@dataclass(frozen=True)
class Observed:
    client: PromClient
    log: LoadLog
    at: float  # evaluation time: just after the load

    @property
    def span(self) -> str:
        return f"{math.ceil(self.at - self.log.start)}s"


def _unix(stamp: str) -> float:
    """An RFC 3339 time from Prometheus' API, in unix seconds."""
    return datetime.fromisoformat(stamp).timestamp()


def _scraped_after(client: PromClient, since: float) -> float:
    """When every target's scrape since `since` (unix time) was in, or 0 while a target has
    not been scraped since."""
    targets = client.targets()
    if not targets or min(_unix(t["lastScrape"]) for t in targets) <= since:
        return 0.0
    return max(_unix(t["lastScrape"]) + float(t["lastScrapeDuration"]) for t in targets)


def _evaluated_after(client: PromClient, since: float) -> bool:
    rules = client.rules()
    return bool(rules) and all(_unix(r["lastEvaluation"]) > since for r in rules)


def _observe(tmp: Path, policy: PolicyName, seconds: float) -> Iterator[Observed]:
    stack = start_demo_stack(tmp, SPEEDUP, policy)
    try:
        config = local_config(stack_targets(stack))
        with PrometheusProcess(workdir=tmp / "prometheus", config=config) as prom:
            client = PromClient(prom.url)
            wait_targets_up(client)
            sc = step_scenario(seconds, output_tokens=24, sprinkle_s=0.4, outage_stream_tokens=400)
            log = asyncio.run(drive(stack, sc))
            ended = time.time()
            # The last scrapes, then the rule evaluations that saw them (1 s each).
            scraped = wait_until(lambda: _scraped_after(client, ended),
                                 "every target scraped after the load")  # fmt: skip
            wait_until(lambda: _evaluated_after(client, scraped),
                       "every rule evaluated after those scrapes")  # fmt: skip
            yield Observed(client, log, time.time())
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    # The dashboards' demo runs golden-range: its overload phase is built around fixed limits.
    yield from _observe(tmp_path_factory.mktemp("observability"), "golden-range", LOAD_SECONDS)


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    yield from _observe(tmp_path_factory.mktemp("observability-learned"), "learned",
                        LEARNED_LOAD_SECONDS)  # fmt: skip


def _describe(series: list[Series]) -> str:
    return f"{len(series)} series, {sum(s.finite for s in series)} finite"


def _require_data(what: str, expr: str, series: list[Series]) -> None:
    assert series, f"{what}: no data from\n  {expr}"
    assert any(s.finite for s in series), f"{what}: only NaN/Inf from\n  {expr}"


def test_load_went_through_every_regime(observed: Observed) -> None:
    st = observed.log.statuses
    assert st["load 200"] > 100
    assert st["load 429"] > 0, st  # saturation
    for client_error in ("bad_json 400", "unknown_model 404", "too_long 400"):
        assert st[client_error] > 0, st
    assert st["engine_error 500"] > 0, st  # failed on every attempt
    assert st["error_mid 200"] > 0, st  # streams the engine broke with an error event
    assert [m for _, m in observed.log.marks if "killed" in m or "back" in m] == [
        "v3-b killed", "v3-b back"]  # fmt: skip


def test_targets_carry_the_compose_jobs_and_labels(observed: Observed) -> None:
    labels = [t["labels"] for t in observed.client.targets()]
    assert sorted((x["job"], x.get("backend", ""), x.get("tier", "")) for x in labels) == [
        ("tiergate", "", ""),
        ("vllm", "v3-a", "throughput"),
        ("vllm", "v3-b", "throughput"),
        ("vllm", "v4", "latency"),
    ]


def _panel_query(observed: Observed, board: str, panel: str, expr: str, legend: str) -> None:
    (dashboard,) = [d for d in DASHBOARDS if d.name == board]
    variables = variable_values(dashboard, observed.client)
    q = substitute(expr, variables, rate_interval=observed.span, interval="1s",
                   range_s=observed.at - observed.log.start)  # fmt: skip
    series = observed.client.query(q, observed.at)
    print(f"panel {board} / {panel} [{legend}]: {_describe(series)}")
    _require_data(f"dashboard {board}, panel {panel!r}", q, series)


@pytest.mark.parametrize(("board", "panel", "expr", "legend"), PANEL_QUERIES)
def test_panel_query_returns_data(
    observed: Observed, board: str, panel: str, expr: str, legend: str
) -> None:
    _panel_query(observed, board, panel, expr, legend)


def _learned_row() -> list[tuple[str, str, str, str]]:
    """(board, panel, expr, legend) of the learned routing row and of the routing reasons."""
    (board,) = [d for d in DASHBOARDS if d.name == "gateway-overview"]
    rows = sorted((p.grid[1], p.title) for p in board.panels if p.type == "row")
    (top,) = [y for y, t in rows if t == LEARNED_ROW]
    bottom = min([y for y, _ in rows if y > top], default=10**6)
    return [(board.name, p.title, t.expr, t.legend) for p, t in board.queries()
            if top < p.grid[1] < bottom or p.title == "Routing reasons"]  # fmt: skip


@pytest.mark.parametrize(("board", "panel", "expr", "legend"), _learned_row())
def test_learned_policy_panel_query_returns_data(
    learned: Observed, board: str, panel: str, expr: str, legend: str
) -> None:
    _panel_query(learned, board, panel, expr, legend)


def test_learned_policy_routes_by_prediction_for_each_slo_class(learned: Observed) -> None:
    c, at = learned.client, learned.at
    reasons = {s.labels["reason"] for s in c.query(
        'sum by (reason) (tiergate_routing_decisions_total{policy="learned"})', at)}  # fmt: skip
    assert "predicted_slo_met" in reasons, reasons
    classes = {s.labels["slo"] for s in c.query("tier_slo:tiergate_slo_met:ratio_rate1m", at)}
    assert {"tpot<=12ms", "tpot<=25ms"} <= classes, classes  # the load's two SLO classes
    (limit,) = c.query("tiergate_latency_tier_limit", at)
    assert limit.points[0][1] >= 1  # the simulated v4 meets 25 ms with at least one stream


@pytest.mark.parametrize("rule", [r for r in RULES if r.kind == "record"], ids=lambda r: r.name)
def test_recording_rule_returns_data(observed: Observed, rule: Rule) -> None:
    series = observed.client.query(rule.name, observed.at)
    print(f"record {rule.name}: {_describe(series)}")
    _require_data(f"recording rule {rule.name} ({rule.file})", rule.expr, series)


@pytest.mark.parametrize("rule", [r for r in RULES if r.kind == "alert"], ids=lambda r: r.name)
def test_alert_signal_returns_data(observed: Observed, rule: Rule) -> None:
    series = observed.client.query(rule.signal, observed.at)
    print(f"alert {rule.name}: {rule.signal} -> {_describe(series)}")
    _require_data(f"alert {rule.name} ({rule.file}), thresholds stripped", rule.signal, series)


def test_every_rule_evaluates_without_error(observed: Observed) -> None:
    loaded = observed.client.rules()
    assert {r["name"] for r in loaded} == {r.name for r in RULES}
    bad = [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"]
    assert not bad


def test_template_variables_have_options(observed: Observed) -> None:
    for board in DASHBOARDS:
        resolved = {v.name: v.all_value or ".*" for v in board.variables}
        for v in board.variables:
            options = variable_options(v, resolved, observed.client)
            print(f"variable {board.name}/${v.name}: {options}")
            assert options, f"{board.name}: ${v.name} has no options ({v.query})"


def test_dashboards_render(observed: Observed, tmp_path: Path) -> None:
    w = Window(observed.log.start - 2, observed.at, 1.0, "4s", tuple(observed.log.marks))
    for board in DASHBOARDS:
        path = tmp_path / f"{board.name}.png"
        drawn = render(board, observed.client, w, path)
        assert path.stat().st_size > 50_000
        empty = [title for title, n in drawn.items() if n == 0]
        assert not empty, f"{board.name}: panels without a series over the run: {empty}"
