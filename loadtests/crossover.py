"""`tiergate bench crossover`: where speculative decoding stops paying, measured on a deployment.

Each engine is driven alone and directly (not through the gateway), with the OpenAI API only
(`/v1/models`, streamed `/v1/completions` with `ignore_eos` and `max_tokens` = the output length,
so every request makes exactly that many tokens), in a closed loop at increasing concurrency. At
each level the two engines run one after the other, and which goes first flips every level, so
both see the same drift of the machine. Per level and engine: TTFT p50, TPOT p50/p99 (the
benchmark method's definitions, over the requests that ran entirely while every user had one in
flight, each user's first being warm-up) and output tokens/s over that window.

From the TPOT curves it derives the crossover (the lowest concurrency at which the latency
engine's TPOT p50 is no better than the throughput engine's, interpolated linearly between
levels), the `golden-range` limits it would recommend, and for each TPOT SLO the largest
concurrency at which each engine still meets it.

TPOT leaves queueing out: an engine whose batch limit (`--max-num-seqs`) is below a level queues
the rest, which shows in TTFT, not in TPOT.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

import aiohttp
import typer
from rich.console import Console
from rich.progress import (
    Progress,
    TaskID,
)
from rich.table import Table

from gateway.routing import PolicyName, PolicyParams
from loadtests.common.options import setup_logging
from loadtests.common.report import bars
from loadtests.common.stats import json_safe, ms, percentile
from loadtests.harness.client import Result, closed_loop, prompt_of, stream_completion

ENGINES: tuple[str, str] = ("latency", "throughput")
DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
DEFAULT_SLO_TPOT_MS: tuple[float, ...] = (12.0, 25.0)
DEFAULT_SECONDS = 30.0
GOLDEN: PolicyName = "golden-range"

Side = Literal["crossed", "never", "from-start", "unmeasured"]


# --- pure: the curves' crossing points and what they recommend ------------------------------


@dataclass(frozen=True)
class Crossing:
    """Where curve `a` first stops being below curve `b`, over the levels measured on both.

    `crossed`: at `at`, interpolated linearly between the last level below and the first level
    not below; `never`: below at every level; `from-start`: not below already at the lowest;
    `unmeasured`: no level has both values."""

    side: Side
    at: float | None = None
    lowest: int = 0  # the lowest and highest level with both values
    highest: int = 0


def first_crossing(levels: Sequence[int], a: Sequence[float], b: Sequence[float]) -> Crossing:
    """The lowest level at which `a >= b`, interpolated; levels where either is NaN are skipped."""
    points = [(c, x - y) for c, x, y in zip(levels, a, b, strict=True)
              if not (math.isnan(x) or math.isnan(y))]  # fmt: skip
    if not points:
        return Crossing("unmeasured")
    lowest, highest = points[0][0], points[-1][0]
    if points[0][1] >= 0:
        return Crossing("from-start", None, lowest, highest)
    for (c1, d1), (c2, d2) in pairwise(points):
        if d2 >= 0:
            return Crossing("crossed", c1 + (c2 - c1) * -d1 / (d2 - d1), lowest, highest)
    return Crossing("never", None, lowest, highest)


def limit_below(crossing: Crossing) -> int:
    """The largest whole concurrency strictly below the crossing, at least 1; the highest level
    measured when `a` stayed below throughout (the limit is at least that)."""
    if crossing.side == "crossed":
        assert crossing.at is not None
        return max(1, math.ceil(crossing.at) - 1)
    if crossing.side == "never":
        return crossing.highest
    return 1


@dataclass(frozen=True)
class Recommendation:
    """`golden-range` limits read off the two TPOT curves (the parameters set are the ones the
    recommendation makes; the rest keep PolicyParams' defaults)."""

    params: PolicyParams
    crossover: Crossing  # latency TPOT vs throughput TPOT at the same concurrency
    cap_crossing: Crossing  # latency TPOT vs throughput TPOT at its highest measured level
    saturated_level: int  # the throughput engine's highest measured level
    saturated_tpot: float
    clamped: bool  # the cap came out below the golden range and was raised to it


def recommend(
    levels: Sequence[int], latency: Sequence[float], throughput: Sequence[float]
) -> Recommendation | None:
    """`latency_max_concurrency`: the largest concurrency at which the latency engine is still
    faster per token than the throughput engine at the same per-instance load.
    `latency_hard_cap`: the largest at which it is still faster than the throughput engine at its
    highest measured level (the load of a saturated pool); never below the former. None when no
    level has a TPOT from both engines."""
    crossover = first_crossing(levels, latency, throughput)
    measured = [(c, t) for c, t in zip(levels, throughput, strict=True) if not math.isnan(t)]
    if crossover.side == "unmeasured" or not measured:
        return None
    sat_level, sat_tpot = measured[-1]
    cap_crossing = first_crossing(levels, latency, [sat_tpot] * len(levels))
    golden, cap = limit_below(crossover), limit_below(cap_crossing)
    # PolicyParams requires hysteresis < latency_max_concurrency: shrink it only when needed.
    if PolicyParams().hysteresis >= golden:
        params = PolicyParams(
            latency_max_concurrency=golden, latency_hard_cap=max(cap, golden), hysteresis=golden - 1
        )
    else:
        params = PolicyParams(latency_max_concurrency=golden, latency_hard_cap=max(cap, golden))
    return Recommendation(params, crossover, cap_crossing, sat_level, sat_tpot, cap < golden)


def policy_snippet(params: PolicyParams) -> str:
    """The gateway configuration's `policy:` block with the parameters set explicitly, each
    with PolicyParams' default beside it."""
    defaults = PolicyParams()
    order = list(PolicyParams.model_fields)
    lines = ["policy:", f"  name: {GOLDEN}"]
    for name in sorted(params.model_fields_set, key=order.index):
        lines.append(f"  {name}: {getattr(params, name)}  # default {getattr(defaults, name)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SloLimit:
    """The largest concurrency whose TPOT p50 meets the SLO, interpolated and rounded down:
    0 when even the lowest level misses it; `beyond` when every level meets it (the limit is
    then at least the highest level)."""

    limit: int
    beyond: bool
    lowest: int

    def text(self) -> str:
        if self.beyond:
            return f">= {self.limit}"
        if self.limit == 0:
            return "none" if self.lowest <= 1 else f"< {self.lowest}"
        return str(self.limit)


def slo_limit(levels: Sequence[int], tpot: Sequence[float], slo: float) -> SloLimit:
    crossing = first_crossing(levels, tpot, [slo] * len(levels))
    if crossing.side == "crossed":
        assert crossing.at is not None
        return SloLimit(math.floor(crossing.at), False, crossing.lowest)
    if crossing.side == "never":
        return SloLimit(crossing.highest, True, crossing.lowest)
    return SloLimit(0, False, crossing.lowest)


def engine_order(level_index: int) -> tuple[str, str]:
    """Latency first at even levels, throughput first at odd ones."""
    return ENGINES if level_index % 2 == 0 else (ENGINES[1], ENGINES[0])


def crossover_text(c: Crossing, names: tuple[str, str] = ENGINES) -> str:
    lat, thr = names
    if c.side == "crossed":
        assert c.at is not None
        return (f"{c.at:.1f} concurrent requests: where the {lat} engine's TPOT p50 first "
                f"reaches the {thr} engine's (linear between the measured levels)")  # fmt: skip
    if c.side == "never":
        return (f"none within the measured levels: the {lat} engine is faster per token at "
                f"every level up to {c.highest}")  # fmt: skip
    if c.side == "from-start":
        return (f"none within the measured levels: the {thr} engine is as fast or faster per "
                f"token already at {c.lowest}")  # fmt: skip
    return "not measured: no level has a TPOT from both engines"


def base_url(url: str) -> str:
    """The engine's root: `http://h:8000`, `http://h:8000/` and `http://h:8000/v1` alike."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


# --- measurement ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    latency: str
    throughput: str
    levels: tuple[int, ...] = DEFAULT_LEVELS
    prompt_tokens: int = 50
    output_tokens: int = 256
    seconds: float = DEFAULT_SECONDS
    requests_per_user: int | None = None  # set: a fixed count per user instead of `seconds`
    model: str | None = None
    api_key: str | None = None
    slo_tpot_ms: tuple[float, ...] = DEFAULT_SLO_TPOT_MS
    out: Path | None = None
    note: str | None = None
    command: str = "tiergate bench crossover"


@dataclass(frozen=True)
class Engine:
    role: str
    url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LevelStats:
    """One engine at one level. Times in ms; `n` = measured requests (Window.measured);
    `short` = successful requests with fewer tokens than asked (ignore_eos refused)."""

    role: str
    concurrency: int
    position: int  # 0: it ran first at this level
    n: int
    errors: int
    short: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    e2e_p50_s: float
    tok_s: float
    window_s: float


def first_model(url: str, headers: dict[str, str]) -> str:
    """The first model the engine lists at `/v1/models`."""
    req = urllib.request.Request(url + "/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            data = json.loads(r.read())
    except urllib.error.HTTPError as e:
        hint = " (give --api-key)" if e.code == 401 else ""
        raise RuntimeError(f"{url}/v1/models answered {e.code}{hint}") from e
    models = [m["id"] for m in data.get("data", ())]
    if not models:
        raise RuntimeError(f"{url}/v1/models lists no model")
    return str(models[0])


def _body(opts: Options, model: str) -> dict[str, object]:
    # The same request closed_loop sends.
    return {
        "model": model, "prompt": prompt_of(opts.prompt_tokens), "max_tokens": opts.output_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip


async def timed_loop(
    engine: Engine,
    concurrency: int,
    opts: Options,
    stagger_s: float,
    on_done: Callable[[Result], None],
) -> list[Result]:
    """closed_loop's users for `opts.seconds` instead of a fixed count: each user sends its next
    request when the last ended, until the time is up, it has finished at least two (the first
    being warm-up), one it sent once every user had started and one that ended after every
    user's first had; nothing in flight is cut off. The last two conditions make a level measure
    something however slow the machine or late its last user (see Window): every user's last
    request ends after the window's start, so the window is not empty, and the user whose last
    request ends first (the window's end) sent it once all had started, so it is measured."""
    body = _body(opts, engine.model)
    url = engine.url + "/v1/completions"
    results: list[Result] = []
    deadline = time.perf_counter() + opts.seconds
    started = 0  # users that have sent their first request
    first_end: list[float] = []  # when each user's first request ended
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

        async def user(u: int) -> None:
            nonlocal started
            await asyncio.sleep(u * stagger_s / concurrency)
            i = 0
            sent_after_all = ended_after_warm_up = False
            while (
                i < 2
                or not (sent_after_all and ended_after_warm_up)
                or (time.perf_counter() < deadline)
            ):
                i += 1
                all_started = started == concurrency
                r = Result(u, i, time.perf_counter())
                if i == 1:
                    started += 1
                r = await stream_completion(session, url, body, r, engine.headers)
                end = r.sent + (r.e2e or 0.0)
                if i == 1:
                    first_end.append(end)
                sent_after_all = sent_after_all or all_started
                warm_up_end = max(first_end) if len(first_end) == concurrency else math.inf
                ended_after_warm_up = ended_after_warm_up or end > warm_up_end
                results.append(r)
                on_done(r)

        await asyncio.gather(*(user(u) for u in range(concurrency)))
    return results


@dataclass(frozen=True)
class Window:
    """When every user of a run had a request in flight: from `start` (the last user's first
    request ended) to `end` (the first user's last request ended): client.window_throughput's
    window, for users that sent different numbers of requests. `all_sent`: the last user's first
    request was sent (before it, the users were still starting)."""

    all_sent: float
    start: float
    end: float

    @property
    def span(self) -> float:
        return self.end - self.start

    def measured(self, r: Result) -> bool:
        """A request measured at the level: not a user's first (warm-up), sent once every user
        had started and finished before any user stopped, so it ran at the full concurrency."""
        finished = r.sent + (r.e2e or 0.0)
        return r.ok and r.index > 1 and r.sent >= self.all_sent and finished <= self.end


def window(results: Sequence[Result]) -> Window | None:
    firsts: dict[int, Result] = {}
    ends: dict[int, list[float]] = {}
    for r in results:
        if r.index == 1:
            firsts[r.user] = r
        ends.setdefault(r.user, []).append(r.sent + (r.e2e or 0.0))
    if not ends or not firsts:
        return None
    all_sent = max(r.sent for r in firsts.values())
    return Window(all_sent, max(min(e) for e in ends.values()), min(max(e) for e in ends.values()))


def active_window(results: Sequence[Result]) -> tuple[float, float]:
    """(output tokens/s, seconds) over the window in which every user is active. A request's
    tokens (its usage) are spread over its chunks in proportion to their words: on the
    simulator a word is a token, on a real engine a chunk's words are not its tokens."""
    w = window(results)
    if w is None or w.span <= 0:
        return math.nan, 0.0
    tokens = 0.0
    for r in results:
        words = sum(n for _, n in r.chunks)
        if words:
            inside = sum(n for t, n in r.chunks if w.start < t <= w.end)
            tokens += inside * (r.tokens / words if r.tokens else 1.0)
    return tokens / w.span, w.span


def level_stats(
    role: str, concurrency: int, position: int, results: Sequence[Result], output_tokens: int
) -> LevelStats:
    """The level's figures over its measured requests (see Window.measured): each user's last
    requests, ending while others have stopped, ran at a lower load and are left out."""
    ok = [r for r in results if r.ok]
    w = window(results)
    measured = [r for r in ok if w is not None and w.measured(r)]
    ttft = [r.ttft * 1e3 for r in measured if r.ttft is not None]
    tpot = [t * 1e3 for r in measured if (t := r.tpot) is not None]
    e2e = [r.e2e for r in measured if r.e2e is not None]
    tok_s, span = active_window(results)
    return LevelStats(
        role, concurrency, position, len(measured), len(results) - len(ok),
        sum(r.tokens < output_tokens for r in ok), percentile(ttft, 50), percentile(ttft, 99),
        percentile(tpot, 50), percentile(tpot, 99), percentile(e2e, 50), tok_s, span,
    )  # fmt: skip


async def _drive(
    engine: Engine, concurrency: int, opts: Options, stagger_s: float,
    on_done: Callable[[Result], None],
) -> list[Result]:  # fmt: skip
    if opts.requests_per_user is None:
        return await timed_loop(engine, concurrency, opts, stagger_s, on_done)
    stats = await closed_loop(
        engine.url + "/v1/completions", concurrency, prompt_tokens=opts.prompt_tokens,
        output_tokens=opts.output_tokens, requests_per_user=opts.requests_per_user,
        model=engine.model, stagger_s=stagger_s, headers=engine.headers, on_done=on_done,
    )  # fmt: skip
    return list(stats.results)


def _probe(engine: Engine, opts: Options) -> tuple[float, str | None]:
    """One request before any level: the engine answers with the model and key given. Returns
    its E2E (seconds) and a note when it made fewer tokens than asked."""
    stats = asyncio.run(closed_loop(
        engine.url + "/v1/completions", 1, prompt_tokens=opts.prompt_tokens,
        output_tokens=opts.output_tokens, requests_per_user=1, model=engine.model,
        headers=engine.headers,
    ))  # fmt: skip
    (r,) = stats.results
    if not r.ok:
        raise RuntimeError(f"{engine.role} engine at {engine.url} (model {engine.model}): "
                           f"status {r.status}: {r.error}")  # fmt: skip
    note = None
    if r.tokens != opts.output_tokens:
        note = (
            f"{engine.role} engine made {r.tokens} tokens when asked for "
            f"{opts.output_tokens} with ignore_eos (no usage chunk, or ignore_eos refused)"
        )
    return r.e2e or 0.0, note


def _advance(progress: Progress, task: TaskID) -> Callable[[Result], None]:
    return lambda _: progress.advance(task)


def run(opts: Options, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    auth = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    engines: dict[str, Engine] = {}
    for role, url in zip(ENGINES, (opts.latency, opts.throughput), strict=True):
        url = base_url(url)
        engines[role] = Engine(role, url, opts.model or first_model(url, auth), auth)
    notes: list[str] = []
    stagger: dict[str, float] = {}  # the engine's median request time at the level before
    for role, engine in engines.items():
        stagger[role], note = _probe(engine, opts)
        notes += [note] if note else []
    runs: dict[str, list[LevelStats]] = {role: [] for role in ENGINES}
    with bars(console) as progress:
        overall = progress.add_task("levels x engines", total=2 * len(opts.levels))
        for i, c in enumerate(opts.levels):
            for position, role in enumerate(engine_order(i)):
                total = c * opts.requests_per_user if opts.requests_per_user else None
                task = progress.add_task(f"{role} at {c}: requests", total=total)
                results = asyncio.run(
                    _drive(engines[role], c, opts, stagger[role], _advance(progress, task))
                )
                progress.remove_task(task)
                stats = level_stats(role, c, position, results, opts.output_tokens)
                if stats.errors:
                    first = next(r for r in results if not r.ok)
                    console.print(f"[red]{role} at {c}: {stats.errors} requests failed, e.g. "
                                  f"status {first.status}: {first.error}")  # fmt: skip
                if not math.isnan(stats.e2e_p50_s):
                    stagger[role] = stats.e2e_p50_s
                runs[role].append(stats)
                progress.advance(overall)
    report = build_report(opts, engines, runs, notes)
    print_report(console, report)
    if opts.out is not None:
        write(report, opts.out)
        console.print(f"wrote crossover.json, crossover.md and crossover.png to {opts.out}")
    return report


# --- the report -----------------------------------------------------------------------------


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def build_report(
    opts: Options, engines: dict[str, Engine], runs: dict[str, list[LevelStats]],
    notes: list[str],
) -> dict[str, Any]:  # fmt: skip
    levels = list(opts.levels)
    tpot = {role: [s.tpot_p50_ms for s in runs[role]] for role in ENGINES}
    crossover = first_crossing(levels, tpot["latency"], tpot["throughput"])
    rec = recommend(levels, tpot["latency"], tpot["throughput"])
    recommendation: dict[str, Any] | None = None
    if rec is not None:
        recommendation = {
            "policy": rec.params.model_dump(include=rec.params.model_fields_set),
            "yaml": policy_snippet(rec.params),
            "saturated_level": rec.saturated_level,
            "saturated_tpot_ms": rec.saturated_tpot,
            "cap_crossing": asdict(rec.cap_crossing),
            "clamped": rec.clamped,
        }
    slos: list[dict[str, Any]] = []
    for slo in opts.slo_tpot_ms:
        limits = {role: slo_limit(levels, tpot[role], slo) for role in ENGINES}
        slos.append(
            {"tpot_ms": slo} | {r: asdict(x) | {"text": x.text()} for r, x in limits.items()}
        )
    short = sum(s.short for r in runs.values() for s in r)
    if short:
        notes.append(f"{short} requests made fewer tokens than asked (ignore_eos refused?)")
    report = {
        "command": opts.command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "client": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "note": opts.note,
        "settings": {
            "levels": levels,
            "prompt_tokens": opts.prompt_tokens,
            "output_tokens": opts.output_tokens,
            "seconds": None if opts.requests_per_user else opts.seconds,
            "requests_per_user": opts.requests_per_user,
            "slo_tpot_ms": list(opts.slo_tpot_ms),
        },
        "engines": {role: {"url": e.url, "model": e.model} for role, e in engines.items()},
        "order": [list(engine_order(i)) for i in range(len(levels))],
        "runs": {role: [asdict(s) for s in runs[role]] for role in ENGINES},
        "crossover": asdict(crossover) | {"text": crossover_text(crossover)},
        "recommendation": recommendation,
        "slo": slos,
        "notes": notes,
    }
    clean: dict[str, Any] = json_safe(report)
    return clean


def _rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per level and engine, in the order they ran: the printed and written tables."""
    rows: list[tuple[str, ...]] = []
    lat, thr = report["runs"]["latency"], report["runs"]["throughput"]
    for i, c in enumerate(report["settings"]["levels"]):
        ratio = _nan(lat[i]["tpot_p50_ms"]) / _nan(thr[i]["tpot_p50_ms"])
        for role in report["order"][i]:
            s = report["runs"][role][i]
            rows.append((
                str(c), role, str(s["n"]), str(s["errors"]), ms(s["ttft_p50_ms"], 0),
                ms(s["tpot_p50_ms"]), ms(s["tpot_p99_ms"]), ms(s["tok_s"], 0),
                ms(ratio, 2) if role == "latency" else "",
            ))  # fmt: skip
    return rows


HEAD = ("conc", "engine", "n", "err", "TTFT p50", "TPOT p50", "TPOT p99", "tok/s", "lat/thr")


def _summary(report: dict[str, Any]) -> list[str]:
    lines = [f"Crossover: {report['crossover']['text']}."]
    rec = report["recommendation"]
    if rec is not None:
        params = PolicyParams.model_validate(rec["policy"])
        reached = rec["cap_crossing"]
        lines.append(
            f"Recommended for golden-range: latency_max_concurrency "
            f"{params.latency_max_concurrency} (the latency engine faster per token than the "
            "throughput engine at the same load), latency_hard_cap "
            f"{params.latency_hard_cap} (faster than the throughput engine's "
            f"{rec['saturated_tpot_ms']:.1f} ms at {rec['saturated_level']}, its highest level"
            + (f", up to {reached['at']:.1f}" if reached["side"] == "crossed" else "")
            + ("; raised to the golden range" if rec["clamped"] else "")
            + ")."
        )
        if report["crossover"]["side"] != "crossed":
            lines.append("These limits rest on curves that did not cross within the levels "
                         "measured: measure a wider range.")  # fmt: skip
    return lines


def print_report(console: Console, report: dict[str, Any]) -> None:
    t = Table(title="Each engine alone, closed loop: times in ms over the requests run while "
                    "every user was active, tok/s over that window; lat/thr = TPOT p50 "
                    "ratio")  # fmt: skip
    for col in HEAD:
        if col == "engine":
            t.add_column(col, no_wrap=True, min_width=len("throughput"))
        else:
            t.add_column(col, justify="right")
    for k, row in enumerate(_rows(report)):
        t.add_row(*row, end_section=k % 2 == 1)
    console.print(t)
    for line in _summary(report):
        console.print(line)
    if report["recommendation"] is not None:
        console.print(report["recommendation"]["yaml"], markup=False, highlight=False)
    s = Table(title="Largest concurrency whose TPOT p50 meets the SLO (interpolated)")
    for col in ("TPOT SLO", *ENGINES):
        s.add_column(col, justify="right")
    for slo in report["slo"]:
        s.add_row(f"{slo['tpot_ms']:g} ms", *(slo[role]["text"] for role in ENGINES))
    console.print(s)
    for note in report["notes"]:
        console.print(f"[yellow]note:[/] {note}")


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "crossover.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "crossover.md").write_text(markdown(report))
    plot(report, out / "crossover.png")


def markdown(report: dict[str, Any]) -> str:
    st = report["settings"]
    per = f"{st['requests_per_user']} requests per user"
    if not st["requests_per_user"]:
        per = f"{st['seconds']:g} s per level and engine (each user at least 2 requests)"
    eng = report["engines"]
    lines = [
        "# Speculative decoding's crossover, measured",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"Date: {report['date']}. Client: {report['client']}.  ",
        f"Latency engine: {eng['latency']['url']} (`{eng['latency']['model']}`); throughput "
        f"engine: {eng['throughput']['url']} (`{eng['throughput']['model']}`).  ",
    ]
    if report["note"]:
        lines.append(f"{report['note']}  ")
    lines += [
        f"Workload: prompt {st['prompt_tokens']} tokens, output {st['output_tokens']} tokens "
        "(`ignore_eos`), greedy, streamed `/v1/completions`; closed loop at "
        f"{', '.join(map(str, st['levels']))} users, {per}. Each engine alone and directly; at "
        "each level the two run one after the other, the first of them alternating.",
        "",
        "TTFT = first text chunk; TPOT = (E2E - TTFT) / (tokens - 1), in ms, over the requests "
        "that ran entirely while every user had one in flight (not a user's first, the "
        "warm-up, nor its last ones, finishing while others had stopped); `n` = requests "
        "measured; lat/thr = the TPOT p50 ratio. tok/s = output tokens over the window in "
        "which every user is active. TPOT "
        "leaves queueing out: an engine whose batch limit is below a level queues the rest, "
        "which shows in TTFT.",
        "",
        "![TPOT and TTFT vs concurrency](crossover.png)",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|---|---|" + "---:|" * (len(HEAD) - 2),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report)]
    for i, line in enumerate(_summary(report)):
        lines += ["", f"**{line}**" if i == 0 else line]
    lines.append("")
    if report["recommendation"] is not None:
        lines += ["The gateway's `policy:` block:", "", "```yaml",
                  report["recommendation"]["yaml"].rstrip(), "```", ""]  # fmt: skip
    lines += ["Largest concurrency whose TPOT p50 meets the SLO (interpolated, rounded down):",
              "", "| TPOT SLO | latency | throughput |", "|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {s['tpot_ms']:g} ms | {s['latency']['text']} | {s['throughput']['text']} |"
              for s in report["slo"]]  # fmt: skip
    if report["notes"]:
        lines += ["", *[f"- {n}" for n in report["notes"]]]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    levels = report["settings"]["levels"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    top = 0.0
    ttft: list[float] = []
    for role, color in zip(ENGINES, ("tab:orange", "tab:blue"), strict=True):
        runs = report["runs"][role]
        for ax, key in ((a, "tpot"), (b, "ttft")):
            p50 = [_nan(s[f"{key}_p50_ms"]) for s in runs]
            p99 = [_nan(s[f"{key}_p99_ms"]) for s in runs]
            ax.plot(levels, p50, "o-", color=color, label=f"{role} p50")
            ax.plot(levels, p99, "--", color=color, alpha=0.5, label=f"{role} p99")
        top = max([top, *(v for s in runs if (v := s["tpot_p99_ms"]) is not None)])
        ttft += [v for s in runs if (v := s["ttft_p50_ms"]) is not None and v > 0]
    cross = report["crossover"]
    if cross["side"] == "crossed":
        a.axvline(cross["at"], color="black", linestyle=":", linewidth=1.2,
                  label=f"crossover {cross['at']:.1f}")  # fmt: skip
    rec = report["recommendation"]
    if rec is not None:
        params = PolicyParams.model_validate(rec["policy"])
        a.axvspan(0, params.latency_max_concurrency, color="tab:orange", alpha=0.07,
                  label=f"golden range (max {params.latency_max_concurrency})")  # fmt: skip
        a.axvline(params.latency_hard_cap, color="tab:orange", linestyle="-.", linewidth=1,
                  label=f"hard cap {params.latency_hard_cap}")  # fmt: skip
        a.axhline(rec["saturated_tpot_ms"], color="tab:blue", linestyle=":", linewidth=1,
                  label=f"throughput at {rec['saturated_level']}")  # fmt: skip
    for slo in report["slo"]:
        if slo["tpot_ms"] <= 1.5 * top:  # an SLO far above the curves would flatten them
            a.axhline(slo["tpot_ms"], color="grey", linestyle=":", linewidth=0.8)
            a.annotate(f"SLO {slo['tpot_ms']:g} ms", (levels[0], slo["tpot_ms"]), fontsize=7,
                       color="grey", va="bottom")  # fmt: skip
    a.set_ylabel("TPOT (ms/token)")
    a.set_title("TPOT vs concurrency")
    b.set_ylabel("TTFT (ms)")
    if ttft and max(ttft) > 10 * min(ttft):  # queueing: seconds beside tens of ms
        b.set_yscale("log")
        b.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    b.set_title("TTFT vs concurrency (queueing shows here)")
    for ax in (a, b):
        ax.set_xlabel("concurrent requests (closed loop, each engine alone)")
        ax.set_xlim(0, levels[-1] * 1.03)
        ax.legend(fontsize=7)
    models = [report["engines"][role]["model"] for role in ENGINES]
    served = models[0] if models[0] == models[1] else f"latency {models[0]}, throughput {models[1]}"
    fig.suptitle(f"{served}; {report['settings']['output_tokens']}-token streams; "
                 f"{report['date']}", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command ------------------------------------------------------------------------------


def _levels(text: str) -> str:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: comma-separated whole numbers") from None
    if not levels or min(levels) < 1:
        raise typer.BadParameter(f"{text!r}: concurrencies of 1 or more")
    return text


def command(
    latency: Annotated[
        str,
        typer.Option(
            "--latency",
            metavar="URL",
            help="The latency engine (EAGLE), e.g. "
            "http://gpu-a:8000: called directly, not through the gateway.",
        ),
    ],
    throughput: Annotated[
        str, typer.Option("--throughput", metavar="URL", help="The throughput engine (AWQ).")
    ],
    levels: Annotated[
        str, typer.Option(callback=_levels, help="Concurrencies, comma-separated.")
    ] = "1,2,4,8,16,24,32,48,64",
    prompt_tokens: Annotated[int, typer.Option(min=1, help="Prompt length (words).")] = 50,
    output_tokens: Annotated[
        int, typer.Option(min=2, help="max_tokens, with ignore_eos: every request's length.")
    ] = 256,
    seconds: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Per level and engine: users keep sending for this long (each "
            "at least 2 requests, the first warm-up). Default 30.",
        ),
    ] = None,
    requests_per_user: Annotated[
        int | None,
        typer.Option(
            min=2, help="Instead of --seconds: this many requests per user, the first warm-up."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name (default: each engine's first in /v1/models).")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Bearer token for both engines (masked in the report).")
    ] = None,
    slo_tpot_ms: Annotated[
        list[float] | None,
        typer.Option(help="TPOT SLOs (ms) for the per-engine limits; repeat. Default 12 and 25."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for crossover.json, .md and .png.")
    ] = None,
    note: Annotated[
        str | None, typer.Option(help="A line for the report: what the engines are.")
    ] = None,
) -> None:
    """Each engine alone at increasing concurrency (closed loop, streamed completions): TTFT,
    TPOT, tok/s per level; where the latency engine stops being faster per token, and the
    golden-range limits that follow."""
    import sys

    from loadtests.common.report import command_line

    if seconds is not None and requests_per_user is not None:
        raise typer.BadParameter("give --seconds or --requests-per-user, not both")
    setup_logging("warning")
    opts = Options(
        latency=latency, throughput=throughput,
        levels=tuple(sorted({int(x) for x in levels.split(",") if x.strip()})),
        prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        seconds=DEFAULT_SECONDS if seconds is None else seconds,
        requests_per_user=requests_per_user, model=model, api_key=api_key,
        slo_tpot_ms=tuple(slo_tpot_ms or DEFAULT_SLO_TPOT_MS), out=out, note=note,
        command=command_line(sys.argv[1:]),
    )  # fmt: skip
    try:
        run(opts)
    except (RuntimeError, OSError) as e:  # an engine that does not answer as asked
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
