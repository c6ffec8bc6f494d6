"""`tiergate bench tenants`: an interactive tenant at a steady low load beside a batch tenant
flooding the same deployment, with the gateway's priorities on and off, against the
interactive tenant alone.

The deployment, fresh for every arm of every round: one v4 simulator (the latency tier) and two
v3 simulators (the throughput pool), all with vLLM's priority scheduling
(`--scheduling-policy priority`, the backends marked `priority_scheduling`), behind one gateway
with two tenants: `interactive-bench` (priority interactive) and `batch-bench` (priority batch).

Arms:
- `solo`: the interactive tenant alone (priorities on): the reference;
- `priorities-on`: both tenants; batch keys go to the pool or wait, the admission queue serves
  interactive first, the engines schedule by vLLM's `priority`;
- `priorities-off`: both tenants, `priorities: false`: every request equal.

Interactive users are closed loops of streamed requests with a short think time; batch users
are closed loops without one. Per arm: the interactive tenant's TTFT and TPOT (p50, p99, over
every round's requests after each user's first), the batch tenant's completed requests,
refusals (429) and output tokens per second; the arms' order rotates each round.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import multiprocessing
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer
import yaml
from rich.console import Console
from rich.progress import Progress

from loadtests.common.options import setup_logging
from loadtests.common.report import (
    JsonReport,
    OutputPaths,
    bars,
    finish_markdown,
    print_tables,
    run_header,
    save,
)
from loadtests.common.stats import json_safe, percentile, rotation
from loadtests.harness.client import Result, prompt_of, stream_completion
from loadtests.harness.procs import GatewayProcess, SimProcess, start_all
from loadtests.harness.stack import MODEL

__all__ = ["ARMS", "Options", "run"]

SOLO, ON, OFF = "solo", "priorities-on", "priorities-off"
ARMS = (SOLO, ON, OFF)
KEYS = {"interactive": "sk-bench-interactive", "batch": "sk-bench-batch"}
GOAL = 1.2  # the interactive tenant's p99s with priorities on, within this of its solo run


@dataclass
class Options(OutputPaths):
    interactive_users: int = 3
    batch_users: int = 32
    seconds: float = 20.0  # per arm per round
    rounds: int = 3
    speedup: float = 1.0
    # The pool engines' running batch (--max-num-seqs): small, so that the batch flood queues
    # rather than streams all at once, as a pool at capacity does; the machine's CPUs then
    # carry about as many streams in every arm.
    pool_max_seqs: int = 8
    prompt_tokens: int = 200
    interactive_tokens: int = 128
    batch_tokens: int = 256
    think_s: float = 0.2  # the interactive users' pause between requests
    arms: tuple[str, ...] = ARMS
    out: Path = Path("docs/results/tenants.json")
    chart: bool = True
    command: str | None = None


# --- the deployment ---------------------------------------------------------------------------


def gateway_config(latency: str, pool: Sequence[str], priorities: bool) -> dict[str, Any]:
    def backend(url: str) -> dict[str, Any]:
        return {"url": url, "models": [MODEL], "priority_scheduling": True}

    return {
        "tiers": [{"name": "latency", "role": "latency", "backends": [backend(latency)]},
                  {"name": "throughput", "role": "throughput",
                   "backends": [backend(u) for u in pool]}],
        "tenants": [{"name": f"{kind}-bench", "priority": kind,
                     "key_sha256": hashlib.sha256(key.encode()).hexdigest()}
                    for kind, key in KEYS.items()],
        "priorities": priorities,
        "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5},
        "log_level": "warning",
    }  # fmt: skip


@contextlib.contextmanager
def deployment(arm: str, opts: Options, workdir: Path, tag: str) -> Iterator[str]:
    """Fresh simulators and a gateway for `arm`: the gateway's URL; all stopped on the way
    out, whatever happens."""
    with contextlib.ExitStack() as stack:
        sims = []
        for i, profile in enumerate(("v4", "v3", "v3")):
            args = ["--speedup", f"{opts.speedup:g}", "--scheduling-policy", "priority"]
            if profile == "v3":
                args += ["--max-num-seqs", str(opts.pool_max_seqs)]
            sims.append(SimProcess(profile=profile, log=workdir / f"{tag}-sim{i}.log", args=args))
        start_all(stack, *sims)  # all three at once
        config = workdir / f"{tag}.yaml"
        doc = gateway_config(sims[0].url, [s.url for s in sims[1:]], arm != OFF)
        config.write_text(yaml.safe_dump(doc))
        # Entered: started and answering /ready.
        gw = stack.enter_context(GatewayProcess(config=config, log=workdir / f"{tag}.log"))
        yield gw.url


# --- the load ---------------------------------------------------------------------------------


@dataclass
class Loads:
    interactive: list[Result] = field(default_factory=list)
    batch: list[Result] = field(default_factory=list)


async def _user(session: aiohttp.ClientSession, url: str, kind: str, u: int, opts: Options,
                deadline: float, out: list[Result]) -> None:  # fmt: skip
    tokens = opts.interactive_tokens if kind == "interactive" else opts.batch_tokens
    body = {
        "model": MODEL,
        "prompt": prompt_of(opts.prompt_tokens),
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {KEYS[kind]}"}
    think = opts.think_s if kind == "interactive" else 0.0
    await asyncio.sleep(u * 0.05)  # no lockstep
    i = 0
    while time.monotonic() < deadline:
        i += 1
        r = await stream_completion(session, url + "/v1/completions", body,
                                    Result(u, i, time.perf_counter()), headers)  # fmt: skip
        out.append(r)
        if r.status == 429:
            await asyncio.sleep(0.5)  # refused: back off as a client would
        elif think:
            await asyncio.sleep(think)


async def _loops(url: str, kind: str, users: int, opts: Options, seconds: float,
                 tick: Any = None) -> list[Result]:  # fmt: skip
    out: list[Result] = []
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300, sock_connect=5)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(_user(session, url, kind, u, opts, deadline, out))
                 for u in range(users)]  # fmt: skip
        try:
            while not all(t.done() for t in tasks):
                if tick is not None:
                    tick(seconds - max(0.0, deadline - time.monotonic()), len(out))
                await asyncio.wait(tasks, timeout=0.25)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise RuntimeError("a user loop failed") from t.exception()
    return out


def _batch_process(url: str, users: int, opts: Options, seconds: float, conn: Any) -> None:
    """The batch tenant's clients, in a process of their own: its streams' parsing must not
    delay the interactive client's clock (as two tenants' clients are two machines)."""
    results = asyncio.run(_loops(url, "batch", users, opts, seconds))
    conn.send([(r.status, r.ok, r.tokens, r.headers.get("x-tiergate-tier", "?"))
               for r in results])  # fmt: skip
    conn.close()


def drive(url: str, arm: str, opts: Options, progress: Progress, task: Any) -> Loads:
    loads = Loads()
    batch = None
    if arm != SOLO:
        ctx = multiprocessing.get_context("spawn")
        here, there = ctx.Pipe(duplex=False)
        batch = ctx.Process(target=_batch_process, args=(url, opts.batch_users, opts,
                                                          opts.seconds, there))  # fmt: skip
        batch.start()
        there.close()

    def tick(done: float, n: int) -> None:
        progress.update(task, completed=done, description=f"  {arm}: {n} interactive requests")

    try:
        loads.interactive = asyncio.run(_loops(url, "interactive", opts.interactive_users, opts,
                                               opts.seconds, tick))  # fmt: skip
        if batch is not None:
            try:
                if not here.poll(opts.seconds + 120):
                    raise EOFError
                reported = here.recv()
            except EOFError:
                raise RuntimeError("the batch tenant's clients did not report") from None
            for status, ok, tokens, tier in reported:
                r = Result(0, 0, 0.0, status=status, tokens=tokens,
                           headers={"x-tiergate-tier": tier})  # fmt: skip
                if not ok and r.error is None and status == 200:
                    r.error = "failed mid-stream"
                loads.batch.append(r)
    finally:
        if batch is not None:
            batch.join(10)
            if batch.is_alive():
                batch.kill()
    return loads


def measure(loads: Loads, seconds: float) -> dict[str, Any]:
    """One run's raw samples and counts (interactive: after each user's first request)."""
    inter = [r for r in loads.interactive if r.ok and r.index > 1]
    batch_ok = [r for r in loads.batch if r.ok]
    return {
        "ttft_ms": [r.ttft * 1000 for r in inter if r.ttft is not None],
        "tpot_ms": [t * 1000 for r in inter if (t := r.tpot) is not None],
        "interactive_requests": len(loads.interactive),
        "interactive_errors": sum(not r.ok for r in loads.interactive),
        "batch_requests": len(loads.batch),
        "batch_done": len(batch_ok),
        "batch_refused": sum(r.status == 429 for r in loads.batch),
        "batch_errors": sum(not r.ok and r.status != 429 for r in loads.batch),
        "batch_tok_s": sum(r.tokens for r in batch_ok) / seconds,
        "tiers": _tiers(loads),
    }


def _tiers(loads: Loads) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for kind, results in (("interactive", loads.interactive), ("batch", loads.batch)):
        counts: dict[str, int] = {}
        for r in results:
            if r.ok:
                tier = r.headers.get("x-tiergate-tier", "?")
                counts[tier] = counts.get(tier, 0) + 1
        out[kind] = counts
    return out


# --- the summary ------------------------------------------------------------------------------

FIGURES = (
    ("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p50_ms", "TPOT p50 (ms)"), ("tpot_p99_ms", "TPOT p99 (ms)"),
)  # fmt: skip
COUNTS = ("interactive_requests", "interactive_errors", "batch_requests", "batch_done",
          "batch_refused", "batch_errors")  # fmt: skip


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per arm: percentiles over every round's samples pooled, each round's p99s, the batch
    throughput's median over rounds, counts summed."""
    out: dict[str, dict[str, Any]] = {}
    for arm, rounds in runs.items():
        ttft = [v for r in rounds for v in r["ttft_ms"]]
        tpot = [v for r in rounds for v in r["tpot_ms"]]
        f: dict[str, Any] = {
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "tpot_p50_ms": percentile(tpot, 50), "tpot_p99_ms": percentile(tpot, 99),
            "samples": len(ttft), "tpot_samples": len(tpot),
            "batch_tok_s": statistics.median(r["batch_tok_s"] for r in rounds),
            "rounds": {"ttft_p99_ms": [percentile(r["ttft_ms"], 99) for r in rounds],
                       "tpot_p99_ms": [percentile(r["tpot_ms"], 99) for r in rounds],
                       "batch_tok_s": [r["batch_tok_s"] for r in rounds]},
            "tiers": _merge([r["tiers"] for r in rounds]),
        }  # fmt: skip
        f |= {k: sum(r[k] for r in rounds) for k in COUNTS}
        out[arm] = f
    return out


def _merge(parts: Sequence[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for part in parts:
        for kind, counts in part.items():
            into = out.setdefault(kind, {})
            for tier, n in counts.items():
                into[tier] = into.get(tier, 0) + n
    return out


def verdicts(arms: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    if SOLO not in arms or ON not in arms:
        return []
    out = []
    for key, label in (("ttft_p99_ms", "TTFT p99"), ("tpot_p99_ms", "TPOT p99")):
        on, solo = arms[ON][key], arms[SOLO][key]
        ratio = on / solo if solo else math.nan
        out.append({"goal": f"interactive {label} with priorities on within {GOAL:g}x of solo",
                    "measured": f"{on:.1f} vs {solo:.1f} ms ({ratio:.2f}x)",
                    "result": "MET" if ratio <= GOAL else "NOT MET"})  # fmt: skip
    if OFF in arms:
        off, on = arms[OFF]["tpot_p99_ms"], arms[ON]["tpot_p99_ms"]
        out.append({"goal": "priorities off: the report shows the difference (TPOT p99)",
                    "measured": f"off {off:.1f} vs on {on:.1f} ms ({off / on:.2f}x)",
                    "result": "MET" if off > on * GOAL else "NOT MET"})  # fmt: skip
    return out


# --- the whole bench --------------------------------------------------------------------------


def run(opts: Options, console: Console | None = None) -> dict[str, Any]:
    """Every arm, fresh engines each time, rounds in rotating order; print the tables and write
    JSON, markdown and PNG."""
    console = console or Console()
    command = opts.command or shlex.join(["tiergate", *sys.argv[1:]])
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in opts.arms}
    with (
        tempfile.TemporaryDirectory(prefix="tiergate-tenants-") as tmp,
        bars(console) as progress,
    ):
        overall = progress.add_task("arms", total=len(opts.arms) * opts.rounds)
        for r in range(opts.rounds):
            for arm in rotation(list(opts.arms), r):
                tag = f"{arm}-r{r}"
                progress.update(overall, description=f"round {r + 1}/{opts.rounds}: {arm}")
                task = progress.add_task("  starting", total=opts.seconds)
                with deployment(arm, opts, Path(tmp), tag) as url:
                    loads = drive(url, arm, opts, progress, task)
                    runs[arm].append(measure(loads, opts.seconds))
                progress.remove_task(task)
                progress.advance(overall)
    arms = summarize(runs)
    report: dict[str, Any] = json_safe({
        **run_header(command, asdict(opts), ("command", "chart")),
        "arms": arms,
        "verdicts": verdicts(arms),
        "notes": _notes(arms),
    })  # fmt: skip
    print_report(report, console)
    save(JsonReport(report), opts, console, chart, markdown)
    return report


def _notes(arms: dict[str, dict[str, Any]]) -> list[str]:
    notes = []
    for arm, f in arms.items():
        if f["interactive_errors"] or f["batch_errors"]:
            notes.append(f"{arm}: {f['interactive_errors']} interactive and {f['batch_errors']} "
                         "batch requests failed (not counting 429s)")  # fmt: skip
    return notes


# --- output -----------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    arms = report["arms"]
    goals = [[v["goal"], v["measured"], v["result"]] for v in report["verdicts"]]
    out = [("Goals", ["goal", "measured", "verdict"], goals)] if goals else []
    head = ["arm", *(label for _, label in FIGURES), "samples", "batch done", "batch 429",
            "batch tok/s"]  # fmt: skip
    rows = [[a, *(_fmt(f[k]) for k, _ in FIGURES), str(f["samples"]), str(f["batch_done"]),
             str(f["batch_refused"]), _fmt(f["batch_tok_s"])] for a, f in arms.items()]  # fmt: skip
    out.append(("The interactive tenant, and the batch tenant beside it (rounds pooled)", head,
                rows))  # fmt: skip
    if SOLO in arms:
        solo = arms[SOLO]
        ratio_rows = [[a, *(f"{f[k] / solo[k]:.2f}x" if solo[k] else "-" for k, _ in FIGURES)]
                      for a, f in arms.items() if a != SOLO]  # fmt: skip
        out.append(("Against the interactive tenant alone (arm / solo)",
                    ["arm", *(label for _, label in FIGURES)], ratio_rows))  # fmt: skip
    where = [[a, kind, ", ".join(f"{t}: {n}" for t, n in sorted(c.items())) or "-"]
             for a, f in arms.items() for kind, c in f["tiers"].items()]  # fmt: skip
    out.append(("Where the requests were served (x-tiergate-tier)", ["arm", "tenant", "tiers"],
                where))  # fmt: skip
    per_round = [[a, k, " / ".join(_fmt(v) for v in f["rounds"][k])]
                 for a, f in arms.items() for k in f["rounds"]]  # fmt: skip
    out.append(("Each round's value", ["arm", "figure", "per round"], per_round))
    return out


def print_report(report: dict[str, Any], console: Console) -> None:
    print_tables(tables(report), console, ("arm", "goal", "measured", "tenant", "tiers"))
    for note in report["notes"]:
        console.print(f"[yellow]note:[/] {note}")


def markdown(saved: JsonReport, chart_file: Path | None) -> str:
    report = saved.data
    s = report["settings"]
    parts = [
        "# Tenants: an interactive tenant beside a batch flood, priorities on and off",
        "",
        f"- Command: `{report['command']}`",
        f"- Date: {report['date']}",
        f"- Machine: `nproc` = {report['nproc']} ({report['machine']}); the client, the "
        "simulators and the gateway share these CPUs.",
        f"- Deployment, fresh for every arm of every round: one `v4` simulator (latency tier) and "
        f"two `v3` (throughput pool, `--max-num-seqs {s['pool_max_seqs']}`), `--speedup "
        f"{s['speedup']:g} --scheduling-policy priority`, "
        "backends marked `priority_scheduling`, behind one gateway (default policy) with two "
        "tenants: `interactive-bench` (interactive) and `batch-bench` (batch).",
        f"- Load: {s['interactive_users']} interactive users (closed loops, think time "
        f"{s['think_s']:g} s, {s['interactive_tokens']} output tokens) and, except in `solo`, "
        f"{s['batch_users']} batch users (closed loops, no think time, {s['batch_tokens']} "
        f"output tokens; a 429 backs off 0.5 s); {s['prompt_tokens']}-token prompts, streamed; "
        f"{s['seconds']:g} s per arm per round, {s['rounds']} rounds, the arms' order rotating.",
        "- Arms: `solo` (the interactive tenant alone), `priorities-on` (batch keys to the pool "
        "or wait, the queue by priority and in turn, vLLM's `priority` to the engines), "
        "`priorities-off` (`priorities: false`: every request equal).",
        "- TTFT: to the first text chunk; TPOT: (last - first text) / (tokens - 1), tokens from "
        "usage; percentiles over every round's requests after each user's first. Batch tok/s: "
        "completed requests' output tokens over the arm's seconds, median of rounds.",
    ]
    chart = None if chart_file is None else (chart_file, "the interactive tenant's p99s per arm")
    return finish_markdown(parts, report["notes"], tables(report), chart)


def chart(saved: JsonReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = saved.data
    arms = report["arms"]
    names = list(arms)
    xs = range(len(names))
    colors = {SOLO: "tab:green", ON: "tab:blue", OFF: "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    for ax, (p50, p99, title) in zip(axes[:2], (
            ("ttft_p50_ms", "ttft_p99_ms", "interactive TTFT, ms (p50; p99 pale)"),
            ("tpot_p50_ms", "tpot_p99_ms", "interactive TPOT, ms (p50; p99 pale)")),
            strict=True):  # fmt: skip
        c = [colors.get(a, "tab:gray") for a in names]
        ax.bar(xs, [arms[a][p99] or math.nan for a in names], 0.8, color=c, alpha=0.35)
        ax.bar(xs, [arms[a][p50] or math.nan for a in names], 0.5, color=c)
        if SOLO in arms and arms[SOLO][p99]:
            ax.axhline(arms[SOLO][p99] * GOAL, color="k", ls="--", lw=1,
                       label=f"{GOAL:g}x solo p99")  # fmt: skip
            ax.legend(fontsize=8)
        ax.set_title(title)
    ax = axes[2]
    ax.bar(xs, [arms[a]["batch_tok_s"] or 0 for a in names], 0.5,
           color=[colors.get(a, "tab:gray") for a in names])  # fmt: skip
    ax.set_title("batch tenant, output tokens/s")
    for ax in axes:
        ax.set_xticks(list(xs), names, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"tenants: interactive beside a batch flood ({report['date']}, "
                 f"nproc={report['nproc']})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the command ------------------------------------------------------------------------------


def command(
    interactive_users: Annotated[
        int, typer.Option(min=1, help="Interactive users (closed loops, with a think time).")
    ] = 3,
    batch_users: Annotated[int, typer.Option(min=1, help="Batch users (closed loops).")] = 32,
    seconds: Annotated[float, typer.Option(min=1, help="Seconds of load per arm per round.")] = 20,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (the arms' order rotates).")] = 3,
    speedup: Annotated[float, typer.Option(help="Run the engines N times faster.")] = 1.0,
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/tenants.json"),
) -> None:
    """Two tenants on one deployment (a v4 latency tier, two v3 in the pool, priority
    scheduling on the engines): an interactive tenant at a steady low load beside a batch
    tenant flooding, with the gateway's priorities on and off, against the interactive tenant
    alone. Reports the interactive tenant's TTFT and TPOT p50/p99 and the batch tenant's
    throughput per arm, ratios against solo, and the goal: p99s within 1.2x of solo with
    priorities on."""

    setup_logging("warning")
    run(Options(interactive_users=interactive_users, batch_users=batch_users, seconds=seconds,
                rounds=rounds, speedup=speedup, out=out))  # fmt: skip
