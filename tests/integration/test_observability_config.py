"""The Prometheus config, rules and Grafana provisioning as files: promtool's checks, the rules'
unit tests, and the dashboards' structure (no live stack; see tests/e2e/test_observability.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.observe.telemetry import Telemetry
from loadtests.harness.promstack import (
    DASHBOARDS_DIR,
    PROMETHEUS_CONFIG,
    REPO,
    RULES_DIR,
    Dashboard,
    Panel,
    load_dashboards,
    load_rules,
    local_config,
    strip_thresholds,
    substitute,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (e.g. apt-get install prometheus)"
)
GRAFANA = REPO / "grafana"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_compose_config_is_valid_with_its_rule_files(tmp_path: Path) -> None:
    # The file as deployed reads /etc/prometheus/rules/*.yml; check a copy that points at the
    # repository's rules so promtool loads and checks them too.
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    config["rule_files"] = [str(RULES_DIR / "*.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    out = promtool("check", "config", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    n_files = len(list(RULES_DIR.glob("*.yml")))
    assert f"SUCCESS: {n_files} rule files found" in out.stdout, out.stdout
    assert promtool("check", "config", str(PROMETHEUS_CONFIG)).returncode == 0


def test_compose_targets_and_labels() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert config["global"]["scrape_interval"] == "5s"
    assert [t for s in jobs["tiergate"]["static_configs"] for t in s["targets"]] == ["gateway:8000"]
    engines = {t: s.get("labels", {}) for s in jobs["vllm"]["static_configs"] for t in s["targets"]}
    assert engines == {
        "v4:8000": {"tier": "latency", "backend": "v4"},
        "v3-a:8000": {"tier": "throughput", "backend": "v3-a"},
        "v3-b:8000": {"tier": "throughput", "backend": "v3-b"},
    }


def test_local_config_swaps_every_target() -> None:
    local = {"gateway:8000": "127.0.0.1:1", "v4:8000": "127.0.0.1:2",
             "v3-a:8000": "127.0.0.1:3", "v3-b:8000": "127.0.0.1:4"}  # fmt: skip
    cfg = local_config(local)
    assert cfg["global"]["scrape_interval"] == cfg["global"]["evaluation_interval"] == "1s"
    targets = [t for j in cfg["scrape_configs"] for s in j["static_configs"] for t in s["targets"]]
    assert sorted(targets) == sorted(local.values())
    with pytest.raises(KeyError, match="v3-b"):
        local_config({k: v for k, v in local.items() if k != "v3-b:8000"})


@needs_promtool
def test_rule_files_pass_promtool_check() -> None:
    out = promtool("check", "rules", *map(str, sorted(RULES_DIR.glob("*.yml"))))
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_rule_unit_tests() -> None:
    tests = sorted((REPO / "deploy" / "prometheus" / "tests").glob("*.yml"))
    assert tests
    out = promtool("test", "rules", *map(str, tests))
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_names_labels_and_annotations() -> None:
    rules = load_rules()
    names = {r.name for r in rules}
    assert {"vllm_requests_per_second", "vllm_p99_latency_ms"} <= names
    for r in rules:
        if r.kind == "record" and not r.name.startswith("vllm_"):
            assert r.name.count(":") == 2, f"{r.name}: not level:metric:operations"
    raw = [
        rule
        for path in RULES_DIR.glob("*.yml")
        for g in yaml.safe_load(path.read_text())["groups"]
        for rule in g["rules"]
        if "alert" in rule
    ]
    assert raw
    for a in raw:
        assert a.get("for"), a["alert"]
        assert a["labels"]["severity"] in ("critical", "warning"), a["alert"]
        assert a["annotations"]["summary"], a["alert"]
        assert a["annotations"]["description"], a["alert"]
        # The e2e test evaluates each alert's signal: there must be a literal threshold to strip.
        assert strip_thresholds(a["expr"]) != a["expr"].strip(), a["alert"]


def test_strip_thresholds() -> None:
    assert strip_thresholds('up{job="vllm"} == 0') == 'up{job="vllm"}'
    assert strip_thresholds("a:b:c > 0.1 and d:e:f > 1") == "a:b:c and d:e:f"
    assert strip_thresholds("min_over_time(x[1m]) > 8") == "min_over_time(x[1m])"
    assert strip_thresholds('rate(x{status!="200",le="5.0"}[5m]) > 1e-3') == (
        'rate(x{status!="200",le="5.0"}[5m])'
    )


def test_grafana_provisioning() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert (source["uid"], source["type"], source["url"]) == (
        "prometheus", "prometheus", "http://prometheus:9090")  # fmt: skip
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/tiergate.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def _boards() -> list[Dashboard]:
    boards = load_dashboards()
    assert {b.name for b in boards} == {"gateway-overview", "backends", "load-test"}
    return boards


@pytest.mark.parametrize("path", sorted(DASHBOARDS_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_dashboard_structure(path: Path) -> None:
    data = json.loads(path.read_text())
    assert data["schemaVersion"] >= 36
    assert data["uid"]
    assert "id" not in data  # provisioned dashboards get their id from Grafana
    ids = []
    cells: set[tuple[int, int]] = set()
    for panel in data["panels"]:
        ids.append(panel["id"])
        gp = panel["gridPos"]
        assert gp["x"] + gp["w"] <= 24, panel["title"]
        cell = {(x, y) for x in range(gp["x"], gp["x"] + gp["w"])
                for y in range(gp["y"], gp["y"] + gp["h"])}  # fmt: skip
        assert not cells & cell, f"{panel['title']} overlaps another panel"
        cells |= cell
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "prometheus"
            assert t["refId"]
            assert t["expr"]
            # rate windows follow the scrape interval, as Grafana computes them
            if "rate(" in t["expr"] or "increase(" in t["expr"]:
                assert "[$__rate_interval]" in t["expr"], f"{panel['title']}: {t['expr']}"
    assert len(ids) == len(set(ids))


def test_every_dashboard_variable_is_defined() -> None:
    for board in _boards():
        values = {v.name: ".*" for v in board.variables}
        for _, target in board.queries():
            substitute(target.expr, values)  # raises on an undefined variable
        for v in board.variables:
            substitute(v.query, values)


# A gateway series name: not part of a recorded name (`job:tiergate_requests:rate1m`).
_GATEWAY_SERIES = re.compile(r"(?<![\w:])tiergate_\w+(?![\w:])")
_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
             "histogram": ("_bucket", "_count", "_sum", "_created")}  # fmt: skip


def _exported() -> set[str]:
    """Every series name the gateway's registry can expose."""
    return {f.name + suffix for f in Telemetry().registry.collect() for suffix in _SUFFIXES[f.type]}


def test_every_gateway_series_queried_is_exported() -> None:
    queried: dict[str, str] = {}
    for board in _boards():
        for panel, target in board.queries():
            for name in _GATEWAY_SERIES.findall(target.expr):
                queried.setdefault(name, f"{board.name} / {panel.title}")
        for v in board.variables:
            for name in _GATEWAY_SERIES.findall(v.query):
                queried.setdefault(name, f"{board.name} / ${v.name}")
    for rule in load_rules():
        for name in _GATEWAY_SERIES.findall(rule.expr):
            queried.setdefault(name, f"{rule.file} / {rule.name}")
    unknown = {name: where for name, where in queried.items() if name not in _exported()}
    assert not unknown, f"series the gateway does not export: {unknown}"


@needs_promtool
def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    # promtool parses each expression of a rule file: every panel target, its variables at
    # "All", becomes one recording rule.
    exprs = [substitute(t.expr, {v.name: ".*" for v in board.variables})
             for board in _boards() for _, t in board.queries()]  # fmt: skip
    rules = [{"record": f"panel_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout, out.stdout


def test_learned_routing_row_shows_the_latency_model() -> None:
    (board,) = [b for b in _boards() if b.name == "gateway-overview"]
    row = _row(board, "Learned routing")
    queried = {name: p.title for p in row for t in p.targets
               for name in _GATEWAY_SERIES.findall(t.expr)}  # fmt: skip
    assert {"tiergate_backend_predicted_tpot_seconds", "tiergate_latency_tier_limit",
            "tiergate_slo_met_total", "tiergate_slo_missed_total",
            "tiergate_backend_spec_acceptance_rate", "tiergate_backend_frontier",
            "tiergate_backend_prefill_seconds_per_token"} <= set(queried), \
        queried  # fmt: skip
    # A curve has a line per backend and concurrency; the SLO share one per tier and class.
    curves = [t for p in row for t in p.targets if "predicted_tpot" in t.expr]
    assert {"tier=\"latency\"", "tier=\"throughput\""} <= {
        m for t in curves for m in re.findall(r'tier="\w+"', t.expr)}  # fmt: skip
    for t in curves:
        assert "{{backend}}" in t.legend, t.legend
        assert "{{concurrency}}" in t.legend, t.legend
    (slo,) = [p for p in row if "slo_met" in p.targets[0].expr]
    assert "by (tier, slo)" in slo.targets[0].expr
    assert "{{slo}}" in slo.targets[0].legend
    # The learned policy's reasons send to either tier: the reasons panel splits by tier too.
    (reasons,) = [p for p in board.panels if p.title == "Routing reasons"]
    assert "by (reason, tier)" in reasons.targets[0].expr


def _row(board: Dashboard, title: str) -> list[Panel]:
    """The panels under a row, up to the next one."""
    rows = sorted((p.grid[1], p.title) for p in board.panels if p.type == "row")
    (top,) = [y for y, t in rows if t == title]
    below = [y for y, _ in rows if y > top]
    bottom = min(below) if below else 10**6
    return sorted((p for p in board.panels if p.type != "row" and top < p.grid[1] < bottom),
                  key=lambda p: (p.grid[1], p.grid[0]))  # fmt: skip
