"""`tiergate bench dashboards`: the Grafana dashboards rendered to PNG from a live run.

A scaled-down deployment (1 x v4 + 2 x v3 simulators behind a gateway, with small batch and
queue limits so a short run crosses every regime) is scraped by a real Prometheus using the
deployed config and rule files, under a step load: few users, many, more than the deployment
holds, few again. Faults are injected on the way so the error, retry and failover panels have
something to show. Then every panel of every dashboard is queried with `query_range`, as Grafana
would, and drawn in the dashboard's own grid with matplotlib.

The same deployment and load drive the end-to-end test that requires every panel query, recording
rule and alert signal to return data.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

import aiohttp
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gateway.routing import DEFAULT_POLICY, PolicyName
from loadtests.common.options import setup_logging
from loadtests.harness.client import prompt_of
from loadtests.harness.procs import SimProcess
from loadtests.harness.promstack import (
    DASHBOARDS_DIR,
    Dashboard,
    Panel,
    PromClient,
    PrometheusProcess,
    Series,
    load_dashboards,
    local_config,
    stack_targets,
    substitute,
    variable_values,
)
from loadtests.harness.stack import MODEL, Stack, add_gateway, start_stack

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def demo_settings(policy: PolicyName = DEFAULT_POLICY) -> dict[str, Any]:
    """Gateway settings of the demo deployment (a fresh dict each call).

    The golden range and the batch/queue limits are scaled down so that a few dozen users (what
    two cores can drive) take it from "all on the latency tier" through "split" to "saturated,
    429". The queue deadline is short because a queued request takes capacity the moment it
    frees: only a queue longer than a tenth of a second of service turns into 429s. 500 is
    retried so that injected engine errors exercise retries and failovers; a small retry budget
    floor lets a burst of failures exhaust it. The monitor scrapes at its default interval, as
    deployed. The latency model learns under every policy; `learned` also routes by it.
    """
    return {
        "policy": {"name": policy, "latency_max_concurrency": 6, "hysteresis": 2,
                   "latency_hard_cap": 8, "max_waiting": 3, "queue_deadline_s": 0.1},
        "retry": {"retry_statuses": [429, 500, 502, 503, 504], "budget_min_per_s": 1.0},
        "monitor": {"scrape_interval_s": 0.25, "probe_interval_s": 0.5},
        # Ejections for failed requests as short as the demo's phases, so the latency engine
        # is back (on probation) for its error phase after the failure burst ejected it.
        "outlier": {"base_ejection_s": 1.0, "max_ejection_s": 3.0},
        "log_level": "warning",
        "releases": [demo_release()],
        "tenants": demo_tenants(),
    }  # fmt: skip


# The demo's gray release: clients ask for RELEASE, split 90/10 between the model as the
# engines serve it now and a canary name the throughput engines also answer to; a share of the
# stable variant's requests is copied to the canary (shadow mode).
RELEASE = "chat"
CANARY = "llama-2-7b-chat-canary"
DEMO_THROUGHPUT_ARGS = ("--max-num-seqs", "6", "--model", MODEL, "--model", CANARY)


# The demo's tenants (keys public, like examples/tenants.yaml): every user's, and one allowed a
# request a minute, which the sprinkles use (the limits' panels).
DEMO_KEY = "sk-demo-dashboards"
CAPPED_KEY = "sk-demo-capped"


def demo_tenants() -> list[dict[str, Any]]:
    def digest(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    return [{"name": "demo-users", "key_sha256": digest(DEMO_KEY), "priority": "interactive"},
            {"name": "demo-capped", "key_sha256": digest(CAPPED_KEY),
             "limits": {"requests_per_minute": 1}}]  # fmt: skip


def demo_release() -> dict[str, Any]:
    return {"model": RELEASE, "variants": [
        {"name": "stable", "model": MODEL, "weight": 90},
        {"name": "canary", "model": CANARY, "weight": 10}],
        "shadow": {"variant": "canary", "share": 0.5}}  # fmt: skip


def start_demo_stack(workdir: Path, speedup: float, policy: PolicyName = DEFAULT_POLICY) -> Stack:
    """The demo deployment; its tiers are named after their roles, as `tiergate up` names them,
    so the `tier` label reads the same on every gateway metric."""
    stack = start_stack(workdir, speedup=speedup, throughput_args=DEMO_THROUGHPUT_ARGS,
                        gateways=0)  # fmt: skip
    try:
        roles = (("latency", stack.latency), ("throughput", stack.throughput))
        models = {"latency": [MODEL], "throughput": [MODEL, CANARY]}
        tiers = [{"name": role, "role": role,
                  "backends": [{"url": s.url, "models": models[role]} for s in sims]}
                 for role, sims in roles]  # fmt: skip
        add_gateway(stack, workdir, "gateway", tiers=tiers, **demo_settings(policy))
    except BaseException:
        stack.stop()
        raise
    return stack


# -- the load -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phase:
    users: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Scenario:
    """Closed-loop users by phase, plus faults at fixed fractions of the whole run."""

    phases: tuple[Phase, ...]
    output_tokens: int = 64
    prompt_tokens: int = 50
    # One user in three asks this TPOT SLO (x-tiergate-slo-tpot-ms), the others the gateway's
    # default: two SLO classes for the SLO panels, and two goals for the learned policy.
    tight_tpot_ms: float = 12.0
    # A burst of requests that fail on every engine: retries beyond the budget, ejections.
    burst_at: float = 0.12
    burst: int = 12
    # The latency engine fails this share of requests for a while: failovers to throughput.
    v4_errors: tuple[float, float] = (0.28, 0.42)
    v4_error_rate: float = 0.3
    # v3-b is killed while it streams (mid-stream errors, `up` 0), then started again.
    outage: tuple[float, float] | None = (0.44, 0.58)
    # The long streams started on the throughput tier just before the kill: the load ends once
    # they have, so shorter ones end a short run sooner (each needs only to be mid-way).
    outage_stream_tokens: int = 1500
    # v3-a starts its answers this late for a while: its slow first tokens are hedged.
    slow: tuple[float, float] = (0.62, 0.72)
    slow_first_token_s: float = 2.0
    # Every so often a request that fails: invalid JSON, unknown model, over-long max_tokens,
    # or an engine error on every attempt.
    sprinkle_s: float = 1.0

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)


def step_scenario(seconds: float = 120.0, **kwargs: Any) -> Scenario:
    """Few users, many (the routing split moves to throughput), more than the deployment
    holds (429s), few again."""
    users = (3, 16, 36, 3)
    return Scenario(tuple(Phase(u, seconds / len(users)) for u in users), **kwargs)


@dataclass
class LoadLog:
    start: float = 0.0  # unix time
    end: float = 0.0
    marks: list[tuple[float, str]] = field(default_factory=list)  # (unix time, what started)
    statuses: Counter[str] = field(default_factory=Counter)  # "kind status" -> count


SPRINKLES = ("bad_json", "unknown_model", "too_long", "engine_error", "capped", "error_mid")


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None = None,
    chat: bool = False,
) -> int:
    """One request, read to the end; its status (0 if the connection failed)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    try:
        async with session.post(url + path, headers=headers, **kw) as r:
            async for _ in r.content.iter_any():
                pass
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


def _slo_headers(sc: Scenario, user: int) -> dict[str, str] | None:
    return {"x-tiergate-slo-tpot-ms": f"{sc.tight_tpot_ms:g}"} if user % 3 == 1 else None


def _body(sc: Scenario, user: int, n: int) -> tuple[dict[str, Any], bool]:
    # A mix: two requests in three stream, one user in four speaks chat, one in five asks for
    # the gray release.
    stream = (user + n) % 3 != 0
    chat = user % 4 == 3
    model = RELEASE if user % 5 == 4 else MODEL
    body: dict[str, Any] = {"model": model, "max_tokens": sc.output_tokens, "ignore_eos": True,
                            "temperature": 0, "stream": stream}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt_of(sc.prompt_tokens)}]
    else:
        body["prompt"] = prompt_of(sc.prompt_tokens)
    return body, chat


async def drive(stack: Stack, sc: Scenario, tick: Callable[[float], None] | None = None) -> LoadLog:
    """Run the scenario against the stack's gateway; `tick(seconds_done)` reports progress."""
    url = stack.gateway.url
    log = LoadLog()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=120)
    auth = {"authorization": f"Bearer {DEMO_KEY}"}  # every request: the demo's tenant
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, headers=auth) as session:
        m0 = time.monotonic()
        log.start = time.time()
        wanted = [0]

        async def at(fraction: float) -> None:
            await asyncio.sleep(max(0.0, m0 + fraction * sc.seconds - time.monotonic()))

        async def user(u: int) -> None:
            n = 0
            while u < wanted[0]:
                n += 1
                body, chat = _body(sc, u, n)
                status = await _send(session, url, body, _slo_headers(sc, u), chat)
                log.statuses[f"load {status}"] += 1
                if status != 200:
                    await asyncio.sleep(0.25)  # back off as a client does on 429/503

        async def sprinkle() -> None:
            k = 0
            while True:
                await asyncio.sleep(sc.sprinkle_s)
                kind = SPRINKLES[k % len(SPRINKLES)]
                k += 1
                status = await _fault_request(session, url, kind)
                log.statuses[f"{kind} {status}"] += 1

        async def burst() -> None:
            await at(sc.burst_at)
            log.marks.append((time.time(), "failure burst"))
            got = await asyncio.gather(
                *(_fault_request(session, url, "engine_error") for _ in range(sc.burst))
            )
            log.statuses.update(f"burst {s}" for s in got)

        async def faulty(url: str, span: tuple[float, float], fault: dict[str, float],
                         mark: str) -> None:  # fmt: skip
            """`fault` on the engine at `url` for `span` of the run; cleared after."""
            await at(span[0])
            log.marks.append((time.time(), mark))
            await _set_faults(session, url, fault)
            await at(span[1])
            await _set_faults(session, url, dict.fromkeys(fault, 0.0))

        async def outage(kill_at: float, back_at: float) -> None:
            victim = stack.throughput[-1]
            await at(kill_at)
            streams = await _streams_on(session, url, victim, sc)
            try:
                log.marks.append((time.time(), "v3-b killed"))
                await asyncio.to_thread(victim.kill)
                await at(back_at)
                await asyncio.to_thread(victim.start)
                log.marks.append((time.time(), "v3-b back"))
                log.statuses.update(f"long {s}" for s in await asyncio.gather(*streams))
            finally:
                for task in streams:
                    task.cancel()

        events: list[Awaitable[None]] = [
            burst(),
            faulty(stack.latency[0].url, sc.v4_errors, {"error_rate": sc.v4_error_rate},
                   f"v4 fails {sc.v4_error_rate:.0%}"),
            faulty(stack.throughput[0].url, sc.slow,
                   {"slow_first_token_s": sc.slow_first_token_s},
                   f"v3-a {sc.slow_first_token_s:g} s late"),
        ]  # fmt: skip
        if sc.outage is not None:
            events.append(outage(*sc.outage))
        background = [asyncio.ensure_future(e) for e in events]
        sprinkler = asyncio.ensure_future(sprinkle())
        users: dict[int, asyncio.Task[None]] = {}
        try:
            for phase in sc.phases:
                log.marks.append((time.time(), f"{phase.users} users"))
                wanted[0] = phase.users
                for u in range(phase.users):
                    if u not in users or users[u].done():
                        users[u] = asyncio.ensure_future(user(u))
                end = time.monotonic() + phase.seconds
                while (left := end - time.monotonic()) > 0:
                    await asyncio.sleep(min(0.5, left))
                    if tick is not None:
                        tick(time.monotonic() - m0)
            wanted[0] = 0
            await asyncio.gather(*background)
            await asyncio.gather(*users.values())
        finally:
            sprinkler.cancel()
            for task in [*background, *users.values()]:
                task.cancel()
            await asyncio.gather(sprinkler, *background, *users.values(), return_exceptions=True)
        log.end = time.time()
    return log


async def _fault_request(session: aiohttp.ClientSession, url: str, kind: str) -> int:
    base: dict[str, Any] = {"model": MODEL, "prompt": "hello", "max_tokens": 8}
    if kind == "bad_json":
        return await _send(session, url, b'{"model": ', {"content-type": "application/json"})
    if kind == "unknown_model":
        return await _send(session, url, {**base, "model": "no-such-model"})
    if kind == "too_long":  # valid for the gateway, refused by the engine (context length)
        return await _send(session, url, {**base, "max_tokens": 100_000})
    if kind == "capped":  # a key allowed one request a minute: 429 from the second on
        return await _send(session, url, base, {"authorization": f"Bearer {CAPPED_KEY}"})
    if kind == "error_mid":  # a stream the engine ends with an error event after its first token
        return await _send(session, url, {**base, "stream": True}, {"x-sim-fault": "error-mid"})
    return await _send(session, url, base, {"x-sim-fault": "error"})


async def _set_faults(session: aiohttp.ClientSession, sim_url: str, faults: dict[str, Any]) -> None:
    async with session.post(sim_url + "/sim/faults", json=faults) as r:
        r.raise_for_status()


async def _streams_on(
    session: aiohttp.ClientSession, url: str, victim: SimProcess, sc: Scenario
) -> list[asyncio.Future[int]]:
    """Start four long streams pinned to the throughput tier and wait (up to 15 s) until one is
    relayed from `victim` (headers arrive with the first bytes), so that killing it breaks a
    stream mid-way; one more each second meanwhile, up to twelve (a busy tier-mate's load may
    draw the first four all to the other)."""
    body = {"model": MODEL, "prompt": prompt_of(sc.prompt_tokens), "ignore_eos": True,
            "max_tokens": sc.outage_stream_tokens, "stream": True}  # fmt: skip
    on_victim = asyncio.Event()

    async def stream() -> int:
        try:
            async with session.post(url + "/v1/completions", json=body,
                                    headers={"x-tiergate-tier": "throughput"}) as r:  # fmt: skip
                if r.headers.get("x-tiergate-backend") == victim.url:
                    on_victim.set()
                async for _ in r.content.iter_any():
                    pass
                return r.status
        except (aiohttp.ClientError, TimeoutError):
            return 0

    streams: list[asyncio.Future[int]] = [asyncio.ensure_future(stream()) for _ in range(4)]
    try:
        for _ in range(15):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(on_victim.wait(), 1)
            if on_victim.is_set():
                break
            if len(streams) < 12:
                streams.append(asyncio.ensure_future(stream()))
    except BaseException:
        for task in streams:
            task.cancel()
        raise
    return streams


# -- rendering ------------------------------------------------------------------------------------

GRAFANA_COLORS = MappingProxyType({"green": "#56A64B", "orange": "#FF9830", "red": "#E02F44",
                                   "yellow": "#FADE2A", "blue": "#3274D9"})  # fmt: skip
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(fmt: str, labels: dict[str, str]) -> str:
    if fmt and fmt != "__auto":
        return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()
    shown = {k: v for k, v in labels.items() if k != "__name__"}
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"


def format_value(unit: str, v: float, decimals: int | None = None) -> str:
    """A value as Grafana would show it in that unit (the few units the dashboards use)."""
    if not math.isfinite(v):
        return "–"

    def num(x: float) -> str:
        if decimals is not None:
            return f"{x:.{decimals}f}"
        return f"{x / 1000:.3g}k" if abs(x) >= 1000 else f"{x:.3g}"

    if unit == "s":
        return f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{num(v)} s"
    if unit == "ms":
        return f"{num(v / 1000)} s" if abs(v) >= 1000 else f"{num(v)} ms"
    if unit == "percentunit":
        return f"{v * 100:.{0 if decimals is None else decimals}f}%"
    if unit == "reqps":
        return f"{num(v)} req/s"
    if unit.startswith("suffix:"):
        return f"{num(v)}{unit[len('suffix:') :]}"
    return num(v)


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    step: float
    rate_interval: str
    marks: tuple[tuple[float, str], ...] = ()  # (unix time, label): dotted lines
    # Shown in legends in place of the first string: loopback addresses as the compose names
    # they stand for (127.0.0.1:41234 -> v3-a:8000).
    aliases: tuple[tuple[str, str], ...] = ()

    def alias(self, text: str) -> str:
        for address, name in self.aliases:
            text = text.replace(address, name)
        return text


def panel_series(
    client: PromClient,
    panel: Panel,
    variables: dict[str, str],
    w: Window,
) -> list[tuple[str, Series]]:
    """Every series of every target of a panel over the window, with its legend."""
    out = []
    for t in panel.targets:
        expr = substitute(t.expr, variables, rate_interval=w.rate_interval,
                          interval=f"{w.step:g}s", range_s=w.end - w.start)  # fmt: skip
        for s in client.query_range(expr, w.start, w.end, w.step):
            out.append((w.alias(legend(t.legend, s.labels)), s))
    return out


def render(
    dashboard: Dashboard,
    client: PromClient,
    w: Window,
    path: Path,
    subtitle: str = "",
    on_panel: Callable[[], None] | None = None,
) -> dict[str, int]:
    """Draw the dashboard in its own grid; returns the number of series drawn per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    variables = variable_values(dashboard, client)
    height = max(p.grid[1] + p.grid[3] for p in dashboard.panels)
    inches = 0.5 * height + 1.5  # a grid unit is 30 px in Grafana; half an inch here

    def below_top(offset: float) -> float:
        return 1 - offset / inches

    fig = plt.figure(figsize=(22, inches))
    grid = GridSpec(height, 24, figure=fig, hspace=3.2, wspace=2.0, left=0.03, right=0.99,
                    top=below_top(1.3), bottom=0.02)  # fmt: skip
    fig.text(0.03, below_top(0.2), dashboard.title, fontsize=15, fontweight="bold", va="top")
    fig.text(0.03, below_top(0.55), subtitle, fontsize=9, color="#555", va="top")
    timeline = "   ·   ".join(f"{t - w.start:.0f} s: {label}" for t, label in w.marks)
    fig.text(0.03, below_top(0.8), timeline, fontsize=9, color="#555", va="top")
    drawn: dict[str, int] = {}
    for panel in dashboard.panels:
        x, y, width, h = panel.grid
        ax = fig.add_subplot(grid[y : y + h, x : x + width])
        if panel.type == "row":
            ax.axis("off")
            ax.text(0, 0.2, panel.title, fontsize=12, fontweight="bold", transform=ax.transAxes)
            ax.axhline(0, color="#bbb", lw=0.8)
            continue
        series = panel_series(client, panel, variables, w)
        drawn[panel.title] = len(series)
        if panel.type == "stat":
            _draw_stat(ax, panel, series, w)
        else:
            _draw_timeseries(ax, panel, series, w)
        if on_panel is not None:
            on_panel()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return drawn


def _grid_values(s: Series, w: Window) -> list[float]:
    n = round((w.end - w.start) / w.step) + 1
    values = [math.nan] * n
    for t, v in s.points:
        i = round((t - w.start) / w.step)
        if 0 <= i < n:
            values[i] = v if math.isfinite(v) else math.nan
    return values


def _draw_timeseries(ax: Axes, panel: Panel, series: list[tuple[str, Series]], w: Window) -> None:
    from matplotlib.ticker import FuncFormatter

    xs = [i * w.step for i in range(round((w.end - w.start) / w.step) + 1)]
    custom = panel.defaults.get("custom", {})
    ys = [(name, _grid_values(s, w)) for name, s in series]
    if panel.stacked and ys:
        ax.stackplot(xs, *[[0.0 if math.isnan(v) else v for v in y] for _, y in ys],
                     labels=[name for name, _ in ys], alpha=0.85)  # fmt: skip
    else:
        for name, y in ys:
            if custom.get("lineInterpolation") == "stepAfter":
                ax.step(xs, y, where="post", label=name, lw=1.2)
            else:
                ax.plot(xs, y, label=name, lw=1.2)
    for value, color in panel.threshold_lines:
        ax.axhline(value, color=GRAFANA_COLORS.get(color, color), ls="--", lw=1)
    for t, _ in w.marks:
        ax.axvline(t - w.start, color="#999", ls=":", lw=0.8)
    unit = panel.unit
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(unit, v)))
    # A little room below the minimum, so that a line at 0 does not hide in the axis.
    top = panel.defaults.get("max")
    if top is not None:
        ax.set_ylim(top=top * 1.05)
    if "min" in panel.defaults:
        low = panel.defaults["min"]
        ax.set_ylim(bottom=low - 0.03 * ((top if top is not None else ax.get_ylim()[1]) - low))
    ax.set_xlim(0, w.end - w.start)
    ax.set_title(panel.title, fontsize=10, loc="left")
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.25)
    ax.set_xlabel("seconds", fontsize=7, labelpad=1)
    if ys:
        ax.legend(fontsize=6.5, loc="upper left", ncol=2 if len(ys) > 4 else 1, framealpha=0.6)
    else:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)


def _draw_stat(ax: Axes, panel: Panel, series: list[tuple[str, Series]], w: Window) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_color("#ddd")
    ax.set_title(panel.title, fontsize=10, loc="left")
    if not series:
        ax.text(0.5, 0.45, "No data", ha="center", va="center", transform=ax.transAxes)
        return
    values = _grid_values(series[0][1], w)
    finite = [v for v in values if math.isfinite(v)]
    last = finite[-1] if finite else math.nan
    color = GRAFANA_COLORS["green"]
    for threshold, c in panel.thresholds:
        if math.isfinite(last) and last >= threshold:
            color = GRAFANA_COLORS.get(c, c)
    xs = [i * w.step for i in range(len(values))]
    top = max(finite) if finite else 1.0
    ax.fill_between(xs, [0.0 if math.isnan(v) else v for v in values], color=color, alpha=0.18,
                    lw=0)  # fmt: skip
    ax.plot(xs, values, color=color, lw=1, alpha=0.7)
    ax.set_ylim(0, (top or 1.0) * 1.6)
    ax.set_xlim(0, w.end - w.start)
    decimals = panel.defaults.get("decimals")
    ax.text(0.5, 0.5, format_value(panel.unit, last, decimals), ha="center", va="center",
            fontsize=22, fontweight="bold", color=color, transform=ax.transAxes)  # fmt: skip


# -- the benchmark --------------------------------------------------------------------------------


def wait_targets_up(client: PromClient, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        targets = client.targets()
        if targets and all(t["health"] == "up" for t in targets):
            return
        if time.monotonic() > deadline:
            down = [t["scrapeUrl"] for t in targets if t["health"] != "up"]
            raise TimeoutError(f"Prometheus targets not up: {down}")
        time.sleep(0.2)


def aliases(stack: Stack) -> tuple[tuple[str, str], ...]:
    return tuple((local, name) for name, local in stack_targets(stack).items())


def describe(sc: Scenario, speedup: float) -> str:
    phases = ", ".join(f"{p.users} users for {p.seconds:g} s" for p in sc.phases)
    return (f"1 x v4 + 2 x v3 simulators (x{speedup:g} speed) behind the gateway; closed-loop "
            f"users ({sc.output_tokens} output tokens, 2/3 streamed): {phases}. "
            "Dotted lines, seconds since the load started:")  # fmt: skip


def run(
    out_dir: Path,
    *,
    seconds: float = 120.0,
    speedup: float = 1.0,
    output_tokens: int = 128,
    step: float = 1.0,
    rate_interval: str = "10s",
    dashboards_dir: Path = DASHBOARDS_DIR,
    console: Console | None = None,
    policy: PolicyName = DEFAULT_POLICY,
) -> dict[str, dict[str, int]]:
    """Run the deployment under the step load and render every dashboard to out_dir."""
    console = console or Console()
    sc = step_scenario(seconds, output_tokens=output_tokens)
    boards = load_dashboards(dashboards_dir)
    drawn: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="tiergate-dashboards-") as tmp:
        with console.status("starting the simulators, the gateway and Prometheus..."):
            stack = start_demo_stack(Path(tmp), speedup, policy)
        try:
            prom = PrometheusProcess(workdir=Path(tmp) / "prometheus",
                                     config=local_config(stack_targets(stack))).start()  # fmt: skip
            try:
                client = PromClient(prom.url)
                wait_targets_up(client)
                time.sleep(3)  # an idle baseline before the load
                with _progress(console) as progress:
                    task = progress.add_task("load", total=sc.seconds)
                    log = asyncio.run(drive(stack, sc, lambda done: progress.update(
                        task, completed=min(done, sc.seconds))))  # fmt: skip
                    progress.update(task, completed=sc.seconds)
                    time.sleep(3)  # the last scrapes and rule evaluations
                    w = Window(log.start - 3, time.time(), step, rate_interval,
                               tuple(log.marks), aliases(stack))  # fmt: skip
                    panels = sum(1 for b in boards for p in b.panels if p.type != "row")
                    task = progress.add_task("render", total=panels)
                    for board in boards:
                        drawn[board.name] = render(board, client, w, out_dir / f"{board.name}.png",
                                                   describe(sc, speedup),
                                                   lambda: progress.advance(task))  # fmt: skip
            finally:
                prom.stop()
        finally:
            stack.stop()
    console.print(f"requests by kind and status: {dict(sorted(log.statuses.items()))}")
    for name, panels_drawn in drawn.items():
        empty = [t for t, n in panels_drawn.items() if n == 0]
        console.print(f"{out_dir / name}.png: {len(panels_drawn)} panels, "
                      f"{sum(panels_drawn.values())} series"
                      + (f"; [red]no data[/]: {empty}" if empty else ""))  # fmt: skip
    _readme(out_dir, sc, policy, speedup, step, rate_interval, seconds, output_tokens, drawn)
    return drawn


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description:<7}"), BarColumn(), TextColumn(
        "{task.completed:.0f}/{task.total:.0f}"), TimeElapsedColumn(), console=console)  # fmt: skip


def _readme(
    out_dir: Path,
    sc: Scenario,
    policy: str,
    speedup: float,
    step: float,
    rate_interval: str,
    seconds: float,
    output_tokens: int,
    drawn: dict[str, dict[str, int]],
) -> None:
    phases = "\n".join(f"{i + 1}. {p.users} users for {p.seconds:g} s"
                       for i, p in enumerate(sc.phases))  # fmt: skip
    images = "\n".join(f"- `{name}.png`: `grafana/dashboards/{name}.json`, {len(d)} panels, "
                       f"{sum(d.values())} series" for name, d in drawn.items())  # fmt: skip
    pct = [round(f * 100) for f in (sc.burst_at, *sc.v4_errors, *(sc.outage or (0, 0)),
                                    *sc.slow)]  # fmt: skip
    k = demo_settings()["policy"]
    golden = (f"`latency_max_concurrency` {k['latency_max_concurrency']}, hard cap "
              f"{k['latency_hard_cap']}, `max_waiting` {k['max_waiting']}, queue deadline "
              f"{k['queue_deadline_s']:g} s")  # fmt: skip
    text = f"""# Dashboard renderings

PNG renderings of the Grafana dashboards in `grafana/dashboards/`, made without a Grafana server
by `tiergate bench dashboards`:

```
tiergate bench dashboards --out docs/dashboards --seconds {seconds:g} --speedup {speedup:g} \\
    --output-tokens {output_tokens} --step {step:g} --rate-interval {rate_interval}
```

{images}

## How they were made
1. A scaled-down deployment starts on loopback: one v4 simulator (latency tier, EAGLE-3
   profile) and two v3 simulators (throughput pool, AWQ profile, `--max-num-seqs 6`) behind one
   gateway running the `{policy}` routing policy, with a small golden range
   ({golden})
   so that a few dozen users cross every regime. 500 answers are retried, with a retry budget
   floor of 1/s. The tiers are named `latency` and `throughput`. The gateway's latency model
   learns each engine's curves whatever the policy routes by. A gray release `{RELEASE}` splits
   90/10 between the model the engines serve and a canary name the throughput engines also
   answer to, and half of the stable variant's requests are copied to the canary (shadow).
2. A real Prometheus scrapes it with `deploy/prometheus/prometheus.yml` (targets swapped for the
   loopback ports, 1 s scrape and rule evaluation) and the rule files of
   `deploy/prometheus/rules/`, so job names, labels and recording rules are the deployed ones.
3. Closed-loop users ({output_tokens} output tokens; two requests in three stream, a quarter of
   the users use the chat endpoint, a third ask a {sc.tight_tpot_ms:g} ms TPOT SLO with
   `x-tiergate-slo-tpot-ms` and the others get the default, 25 ms, a fifth ask for the gray
   release) follow a step shape:
{_indent(phases)}
4. Faults, at fixed points of the run (dotted vertical lines): a burst of {sc.burst} requests
   that fail on every engine at {pct[0]}% (retries past the budget, ejections); the v4 engine
   failing {sc.v4_error_rate:.0%} of its requests from {pct[1]}% to {pct[2]}% (failovers to the
   throughput tier); v3-b killed while it streams at {pct[3]}% and started again at {pct[4]}%
   (its streams continue on the other engines); v3-a starting its answers
   {sc.slow_first_token_s:g} s late from {pct[5]}% to {pct[6]}% (hedged first tokens); and,
   every {sc.sprinkle_s:g} s, one request with invalid JSON, an unknown model, an
   over-long `max_tokens`, an engine error, the key of a tenant allowed one request a
   minute (every request carries a key: the demo's tenants), or a stream the engine ends with
   an error event after its first token (a mid-stream error).
5. Every panel target of every dashboard is queried with `query_range` (step {step:g} s,
   `$__rate_interval` = {rate_interval}, template variables at "All") and drawn in the
   dashboard's own 24-column grid with matplotlib: titles, units, legends from `legendFormat`,
   thresholds drawn as dashed lines where the panel draws them. The x axis is seconds since the
   start of the load. Times are wall-clock at x{speedup:g} simulator speed. Legends show the
   loopback addresses as the compose names they stand for (`http://v3-a:8000`, `v4:8000`).

These are static pictures of what Grafana shows live; the layout and colours are approximate.
Stat panels show the value at the end of the window (after the load), over a sparkline.

## What to look for
- Gateway overview: the routing split is all latency tier with 3 users and moves to the
  throughput tier once the latency tier's concurrency leaves its golden range; failovers
  (latency to throughput) while v4 fails; ejections and "in rotation" dips for the failure
  burst and the killed engine; 429s ("refused: saturated") only in the overload phase.
- Engines: v3-b's `up` and "in rotation" drop while it is down; queues build on the throughput
  engines in the overload phase; draft acceptance and mean acceptance length of v4 stay at the
  profile's values whatever the load; the HPA signals are the 1-minute recording rules, with
  the autoscaler's triggers (14 req/s, 3 s) and the SLA (5 s) as dashed lines.
- Gateway overview, learned routing: the latency model's predicted TPOT curves (a line per
  backend and concurrency, the default 25 ms SLO dashed) appear with the first streams and
  move as the load steps up; v4 (EAGLE-3) is predicted well under the
  throughput engines wherever it has run. The model sees only the concurrencies a backend
  runs at and extrapolates past them: under golden-range v4 never holds more than its hard cap
  of {k["latency_hard_cap"]} streams, so its curve above that, and "Latency tier limit" (the
  count stops at 256), swing with what it saw at up to {k["latency_hard_cap"]} streams; under
  `learned` the overload phase takes v4 to a few dozen streams, its curve rises past the
  throughput engines' there and the limit settles at what v4 holds within 25 ms.
  "SLO met, by request class": the {sc.tight_tpot_ms:g} ms class misses on the throughput tier,
  whose engines stream at about 14 ms per token; the 25 ms class misses there in the overload
  phase, when requests queue past the 1 s TTFT SLO. The draft acceptance is v4's cumulative
  acceptance as the gateway scrapes it (its profile's, flat), which scales v4's predicted
  curve. With `learned`, "Routing reasons" shows `predicted_slo_met`, `headroom`, `frontier`,
  `drain` and `explore` by tier, and "Observed frontier" each backend's most streams observed
  climbing as the load steps up (it never falls: a knee once seen stays known).
- Load test: offered and completed part ways when the deployment saturates; the SLO-met share
  and E2E p99 against the 5 s SLA show what the users of that phase experienced.
"""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "README.md").write_text(text)


def _indent(text: str) -> str:
    return "\n".join("   " + line for line in text.splitlines())


# -- the command ------------------------------------------------------------------------------


def command(
    out: Annotated[Path, typer.Option(help="Folder for the PNGs and their README.")] = Path(
        "docs/dashboards"
    ),
    seconds: Annotated[
        float, typer.Option(min=4, help="Length of the step load (four equal phases).")
    ] = 120.0,
    speedup: Annotated[float, typer.Option(help="Run the engines N times faster.")] = 1.0,
    output_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 128,
    step: Annotated[float, typer.Option(help="query_range step, seconds.")] = 1.0,
    rate_interval: Annotated[
        str, typer.Option(help="What $__rate_interval stands for in the panel queries.")
    ] = "10s",
) -> None:
    """Render the Grafana dashboards to PNG without Grafana: a simulated deployment scraped by
    a real Prometheus (the deployed config and rules) under a step load with injected faults,
    every panel queried with query_range and plotted in the dashboard's grid."""
    from rich.console import Console

    setup_logging("warning")
    run(out, seconds=seconds, speedup=speedup, output_tokens=output_tokens, step=step,
        rate_interval=rate_interval, console=Console())  # fmt: skip
