"""A real Prometheus next to a loopback stack, and every query the dashboards and rules make.

The compose stack's Prometheus config (deploy/prometheus/prometheus.yml) is reused as is, with
its targets swapped for the loopback ports of a `loadtests.harness.stack.Stack` and shorter
intervals, so the job names, labels and relabelling under test are the deployed ones. The Grafana
dashboards (grafana/dashboards/*.json) are read into panels and targets whose expressions can
be evaluated once their variables are substituted, as Grafana would.

Used by the end-to-end observability test and by `tiergate bench dashboards`.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

import yaml

from loadtests.harness.procs import ManagedProcess
from loadtests.harness.stack import Stack

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
DASHBOARDS_DIR = REPO / "grafana" / "dashboards"
NO_PROMETHEUS = "prometheus is not installed (e.g. apt-get install prometheus)"

# The compose services a loopback stack stands in for, in the stack's own order.
COMPOSE_GATEWAY = "gateway:8000"
COMPOSE_LATENCY = ("v4:8000",)
COMPOSE_THROUGHPUT = ("v3-a:8000", "v3-b:8000")


# -- Prometheus ---------------------------------------------------------------------------------


def stack_targets(stack: Stack) -> dict[str, str]:
    """Compose address -> loopback address of the process that plays it."""
    if len(stack.latency) != len(COMPOSE_LATENCY) or len(stack.throughput) != len(
        COMPOSE_THROUGHPUT
    ):
        raise ValueError("the compose config names 1 latency and 2 throughput engines")
    engines = zip((*COMPOSE_LATENCY, *COMPOSE_THROUGHPUT), stack.sims, strict=True)
    out = {name: f"{sim.host}:{sim.port}" for name, sim in engines}
    out[COMPOSE_GATEWAY] = f"{stack.gateway.host}:{stack.gateway.port}"
    return out


def local_config(
    targets: Mapping[str, str],
    *,
    interval: str = "1s",
    rules_dir: Path = RULES_DIR,
    base: Path = PROMETHEUS_CONFIG,
) -> dict[str, Any]:
    """The compose config with every static target replaced by its local address, every
    interval set to `interval` and the rule files read from `rules_dir`."""
    cfg: dict[str, Any] = copy.deepcopy(yaml.safe_load(base.read_text()))
    cfg["global"] = {
        **cfg.get("global", {}),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "evaluation_interval": interval,
    }
    cfg["rule_files"] = [str(rules_dir / "*.yml")]
    unused = set(targets)
    for job in cfg.get("scrape_configs", []):
        job.pop("scrape_interval", None)
        job.pop("scrape_timeout", None)
        for static in job.get("static_configs", []):
            swapped = []
            for target in static["targets"]:
                if target not in targets:
                    raise KeyError(f"no local address for {target} (job {job['job_name']})")
                swapped.append(targets[target])
                unused.discard(target)
            static["targets"] = swapped
    if unused:
        raise KeyError(f"targets not in {base.name}: {sorted(unused)}")
    return cfg


@dataclass(kw_only=True)
class PrometheusProcess(ManagedProcess):
    """A `prometheus` server on a loopback port, its data, config and log under `workdir`."""

    workdir: Path
    config: dict[str, Any]
    ready_path: str = "/-/ready"

    def __post_init__(self) -> None:
        self.log = self.workdir / "prometheus.log"

    def command(self) -> list[str]:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError(NO_PROMETHEUS)
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]

    def start(self, timeout: float = 30.0) -> Self:
        return super().start(timeout)


class PromError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Series:
    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]  # (unix time, value); one point for an instant

    @property
    def finite(self) -> bool:
        return any(math.isfinite(v) for _, v in self.points)


class PromClient:
    """Prometheus' HTTP API, just what the tests and the renderings need (stdlib only)."""

    def __init__(self, url: str, timeout: float = 15.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout

    def _call(self, path: str, params: Sequence[tuple[str, str]], post: bool = False) -> Any:
        data = urllib.parse.urlencode(params)
        if post:
            req = urllib.request.Request(
                self.url + path,
                data=data.encode(),
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
        else:
            req = urllib.request.Request(f"{self.url}{path}?{data}" if data else self.url + path)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            # 400/422 carry Prometheus' own message: the one worth showing.
            try:
                body = json.loads(e.read())
            except json.JSONDecodeError:
                raise PromError(f"{path}: HTTP {e.code}") from None
        if body.get("status") != "success":
            raise PromError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        params = [("query", expr)] + ([("time", f"{at:.3f}")] if at is not None else [])
        data = self._call("/api/v1/query", params, post=True)
        if data["resultType"] == "scalar":
            t, v = data["result"]
            return [Series({}, ((float(t), float(v)),))]
        return [
            Series(r["metric"], ((float(r["value"][0]), float(r["value"][1])),))
            for r in data["result"]
        ]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        params = [("query", expr), ("start", f"{start:.3f}"), ("end", f"{end:.3f}"),
                  ("step", f"{step:g}")]  # fmt: skip
        data = self._call("/api/v1/query_range", params, post=True)
        return [
            Series(r["metric"], tuple((float(t), float(v)) for t, v in r["values"]))
            for r in data["result"]
        ]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = [("match[]", match)] if match else []
        values: list[str] = self._call(f"/api/v1/label/{label}/values", params)
        return values

    def rules(self) -> list[dict[str, Any]]:
        groups = self._call("/api/v1/rules", [])["groups"]
        return [rule for g in groups for rule in g["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self._call("/api/v1/targets", [])["activeTargets"]
        return active


# -- dashboards ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    ref_id: str
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    id: int
    type: str
    title: str
    grid: tuple[int, int, int, int]  # x, y, w, h in Grafana's 24-column grid
    targets: tuple[Target, ...]
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def defaults(self) -> Mapping[str, Any]:
        d: Mapping[str, Any] = self.raw.get("fieldConfig", {}).get("defaults", {})
        return d

    @property
    def unit(self) -> str:
        return str(self.defaults.get("unit", "short"))

    @property
    def stacked(self) -> bool:
        return bool(self.defaults.get("custom", {}).get("stacking", {}).get("mode") == "normal")

    @property
    def thresholds(self) -> list[tuple[float, str]]:
        """(value, color) of each threshold step above the base one."""
        steps = self.defaults.get("thresholds", {}).get("steps", [])
        return [(float(s["value"]), str(s["color"])) for s in steps if s.get("value") is not None]

    @property
    def threshold_lines(self) -> list[tuple[float, str]]:
        """The thresholds a time series panel draws as lines (none unless it is set to)."""
        mode = self.defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode", "off")
        return [] if mode == "off" else self.thresholds


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    type: str
    query: str
    include_all: bool
    all_value: str | None
    current: str | None


@dataclass(frozen=True, slots=True)
class Dashboard:
    name: str  # file stem
    uid: str
    title: str
    panels: tuple[Panel, ...]  # rows included, nested panels flattened
    variables: tuple[Variable, ...]

    def queries(self) -> Iterator[tuple[Panel, Target]]:
        for panel in self.panels:
            for target in panel.targets:
                yield panel, target


def _text(value: Any) -> str | None:
    if isinstance(value, list):
        return str(value[0]) if value else None
    return None if value is None else str(value)


def load_dashboard(path: Path) -> Dashboard:
    data = json.loads(path.read_text())
    panels: list[Panel] = []

    def add(raw: Mapping[str, Any]) -> None:
        gp = raw.get("gridPos", {})
        targets = tuple(
            Target(str(t.get("refId", "")), str(t["expr"]), str(t.get("legendFormat", "")))
            for t in raw.get("targets", [])
            if t.get("expr") and not t.get("hide")
        )
        panels.append(Panel(int(raw.get("id", 0)), str(raw["type"]), str(raw.get("title", "")),
                            (int(gp.get("x", 0)), int(gp.get("y", 0)), int(gp.get("w", 12)),
                             int(gp.get("h", 8))), targets, raw))  # fmt: skip
        for inner in raw.get("panels", []):  # a collapsed row keeps its panels inside
            add(inner)

    for raw in data.get("panels", []):
        add(raw)
    variables = []
    for v in data.get("templating", {}).get("list", []):
        query = v.get("query", "")
        if isinstance(query, dict):
            query = query.get("query", "")
        current = v.get("current", {}).get("value")
        variables.append(Variable(str(v["name"]), str(v.get("type", "")), str(query),
                                  bool(v.get("includeAll")), v.get("allValue"),
                                  _text(current)))  # fmt: skip
    return Dashboard(path.stem, str(data.get("uid", "")), str(data.get("title", "")),
                     tuple(panels), tuple(variables))  # fmt: skip


def load_dashboards(folder: Path = DASHBOARDS_DIR) -> list[Dashboard]:
    return [load_dashboard(p) for p in sorted(folder.glob("*.json"))]


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)(?::\w+)?\]\]|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)\s*$", re.S)


def substitute(
    text: str,
    variables: Mapping[str, str],
    *,
    rate_interval: str = "1m",
    interval: str = "15s",
    range_s: float = 3600.0,
) -> str:
    """Grafana's interpolation of `$var`, `${var}`, `${var:fmt}`, `[[var]]` and the built-ins
    `$__rate_interval`, `$__interval`, `$__range` (+ `_s`, `_ms`). An unknown name is an error,
    not a silent literal."""
    builtins = {
        "__rate_interval": rate_interval,
        "__interval": interval,
        "__range": f"{round(range_s)}s",
        "__range_s": str(round(range_s)),
        "__range_ms": str(round(range_s * 1000)),
    }

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in builtins:
            return builtins[name]
        if name in variables:
            return variables[name]
        raise KeyError(f"undefined dashboard variable ${name} in {text!r}")

    return _VARIABLE.sub(one, text)


def variable_values(dashboard: Dashboard, client: PromClient | None = None) -> dict[str, str]:
    """What each template variable stands for when 'All' is selected; a variable without
    'All' takes its first value from Prometheus (or its saved current value)."""
    values: dict[str, str] = {}
    for v in dashboard.variables:
        if v.include_all:
            values[v.name] = v.all_value or ".*"
        elif v.type in ("constant", "textbox", "custom"):
            values[v.name] = v.current or v.query.split(",")[0].strip()
        elif client is not None:
            found = variable_options(v, values, client)
            values[v.name] = found[0] if found else (v.current or "")
        else:
            values[v.name] = v.current or ""
    return values


def variable_options(v: Variable, resolved: Mapping[str, str], client: PromClient) -> list[str]:
    """A query variable's options, as Grafana's `label_values(...)` would list them."""
    m = _LABEL_VALUES.match(v.query)
    if m is None:
        raise ValueError(f"variable {v.name}: only label_values(...) queries are supported")
    match = substitute(m.group(1), resolved) if m.group(1) else None
    return client.label_values(m.group(2), match)


# -- rules --------------------------------------------------------------------------------------

# A comparison with a literal threshold (`> 5`, `== 0`, `> bool 0.1`); label matchers such as
# `!="200"` are followed by a quote, not a number, and are left alone.
_THRESHOLD = re.compile(
    r"\s*(?:==|!=|>=|<=|>|<)\s*(?:bool\s+)?[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?(?![\w.])",
    re.IGNORECASE,
)


def strip_thresholds(expr: str) -> str:
    """The signal an alert compares: its expression without the literal thresholds."""
    return _THRESHOLD.sub("", expr).strip()


@dataclass(frozen=True, slots=True)
class Rule:
    kind: Literal["record", "alert"]
    name: str
    expr: str
    group: str
    file: str

    @property
    def signal(self) -> str:
        return strip_thresholds(self.expr) if self.kind == "alert" else self.expr


def load_rules(folder: Path = RULES_DIR) -> list[Rule]:
    rules = []
    for path in sorted(folder.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                kind: Literal["record", "alert"] = "record" if "record" in r else "alert"
                rules.append(Rule(kind, r[kind], r["expr"].strip(), group["name"], path.name))
    return rules
