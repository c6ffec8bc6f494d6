"""`tiergate bench peers`: what tiergate costs as a proxy hop, against its peers, in one run.

One `instant` simulator (no model time) sits behind every target: `direct` (the simulator
itself), `nginx` (the floor of any proxy hop), `tiergate` (`tiergate serve`, one worker, one tier
holding the simulator), `tiergate-2w` (`tiergate serve --workers 2`, where that option exists),
`tiergate-granian` (the same gateway app served by granian, a Rust HTTP server, through
gateway.serve.asgi: what another front server would cost), `vllm-router` (vLLM's router,
Rust), `smg` (SGLang's model gateway, Rust) and `litellm` (LiteLLM's proxy, Python). The peers
run from a virtual environment of their own (loadtests/harness/peerenv.py), installed on first
use; a peer that cannot be installed or started is left out with a note.

The measurements are `tiergate bench overhead`'s, from the same functions, on every target in
rounds whose order rotates, with the same client:

1. small non-streamed requests at 1 connection (closed loop) and at 64 connections (open loop at
   a fixed aggregate rate, each latency timed from its scheduled start): p50 and p99, and the
   *added* latency (the target's percentile minus direct's, in the same round);
2. wrk at 64 connections: small requests/s, and the proxy's CPU per request (user + system time
   of every process of the target's tree, /proc, over the wrk run, per request wrk completed;
   for the paced cell and the streams also the system's part of it);
3. wrk streaming 64-token SSE responses: tokens/s (streams/s x the tokens one stream carries
   through that target, counted before the run).

Every figure is the median of the rounds' own values; the report shows each round's too, and the
sample counts.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import aiohttp
import typer
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from engines.sim.profile import load_profile
from loadtests import overhead
from loadtests.common.options import PEERS_VENV_HELP, known, setup_logging, without
from loadtests.common.report import OutputPaths, finish_markdown, save
from loadtests.common.stats import Cpu, Samples, Stat, json_safe, median, ratio
from loadtests.harness.baseline import REPO
from loadtests.harness.client import event_loop_runner
from loadtests.harness.nginx import NginxProcess, nginx_binary
from loadtests.harness.peerenv import PEERS, PeerProcess, default_venv, ensure, process_tree, scrub
from loadtests.harness.procs import GatewayProcess, GranianGatewayProcess, SimProcess, free_port
from loadtests.harness.proxied import (
    PROFILE,
    SSE_TOKENS,
    Target,
    gateway_config,
    small_body,
    stream_body,
    wrk_script,
)
from loadtests.overhead import Raw, Verdict

DIRECT = "direct"
GATEWAY = "tiergate"
WORKERS = "tiergate-2w"
GRANIAN = "tiergate-granian"
RIVAL = "litellm"  # the peer tiergate must be ahead of on every figure
TARGETS = (DIRECT, "nginx", GATEWAY, WORKERS, GRANIAN, *PEERS)
CONNECTIONS = 64
WRK_THREADS = 2
# A slow proxy's answers are slow, not failed: only one later than this counts as an error.
WRK_TIMEOUT_S = 30

# The goals: tiergate's CPU per request (wrk) and its added p50 at 1 connection.
MAX_CPU_MS = 0.30
MAX_ADDED_P50_1_MS = 0.5

DESCRIPTIONS = {
    DIRECT: "the simulator called directly (the reference)",
    "nginx": "nginx, one worker, keep-alive upstream, no buffering: the floor of a proxy hop",
    GATEWAY: "`tiergate serve`, one worker, one throughput tier holding the simulator",
    WORKERS: "`tiergate serve --workers 2`, the same config",
    GRANIAN: "the same gateway app under granian (ASGI, one worker, uvloop, HTTP/1), through "
    "`gateway.serve.asgi:app`, without `tiergate serve`'s own protocol and writes",
    "vllm-router": "vLLM's router (`vllm-router`, Rust), the simulator as its one worker",
    "smg": "SGLang's model gateway (`smg launch`, Rust), the simulator as its one worker",
    "litellm": "LiteLLM's proxy (`litellm --config`, one worker), a `hosted_vllm/` deployment",
}


@dataclass(frozen=True)
class Spec:
    """One figure of the comparison: how it is named and which way is better."""

    key: str
    label: str
    unit: str
    better: Literal["lower", "higher"]


FIGURES = (
    Spec("added_p50_1", "added p50, 1 conn", "ms", "lower"),
    Spec("added_p99_1", "added p99, 1 conn", "ms", "lower"),
    Spec("added_p50_c", f"added p50, {CONNECTIONS} conns", "ms", "lower"),
    Spec("added_p99_c", f"added p99, {CONNECTIONS} conns", "ms", "lower"),
    Spec("rps", f"req/s, {CONNECTIONS} conns (wrk)", "req/s", "higher"),
    Spec("cpu_ms", "CPU ms/request (wrk)", "ms", "lower"),
    Spec("sse_tokens_s", "SSE tokens/s (wrk)", "tokens/s", "higher"),
)
# Shown beside them, judged by nothing.
EXTRA = (
    Spec("p50_1", "p50, 1 conn", "ms", "lower"),
    Spec("p99_1", "p99, 1 conn", "ms", "lower"),
    Spec("p50_c", f"p50, {CONNECTIONS} conns", "ms", "lower"),
    Spec("p99_c", f"p99, {CONNECTIONS} conns", "ms", "lower"),
    Spec("cpu_paced_ms", f"CPU ms/request, paced {CONNECTIONS} conns", "ms", "lower"),
    Spec("cpu_paced_sys_ms", "of it system", "ms", "lower"),
    Spec("sse_cpu_ms", "CPU ms per 64-token stream (wrk)", "ms", "lower"),
    Spec("sse_sys_ms", "of it system", "ms", "lower"),
)
SPECS = {s.key: s for s in (*FIGURES, *EXTRA)}


@dataclass(frozen=True)
class Options(OutputPaths):
    rounds: int = 3
    duration_s: float = 3.0  # per latency cell per target per round
    rate: float = 400.0  # aggregate req/s of the paced load at 64 connections
    wrk_seconds: int = 5  # 0 skips wrk
    targets: tuple[str, ...] = TARGETS
    venv: Path | None = None  # default: peerenv.default_venv()
    install: bool = True
    peer_policy: str = "round_robin"  # vllm-router's and smg's
    out: Path = Path("docs/results/peers.json")
    chart: bool = True
    command: str | None = None


@dataclass(frozen=True)
class Figure:
    value: float  # the median of the rounds'
    rounds: list[float]

    @classmethod
    def of(cls, rounds: Sequence[float]) -> Figure:
        return cls(median(rounds), list(rounds))


@dataclass
class Report:
    command: str
    date: str
    nproc: int
    machine: str
    settings: dict[str, Any]
    targets: list[str]
    versions: dict[str, str]
    notes: list[str]
    figures: dict[str, dict[str, Figure]]  # target -> figure key -> figure
    counts: dict[str, dict[str, int]]  # target -> samples and errors per measurement
    tokens_per_stream: dict[str, int]
    verdicts: list[Verdict] = field(default_factory=list)

    def value(self, target: str, key: str) -> float:
        fig = self.figures.get(target, {}).get(key)
        return fig.value if fig is not None else math.nan

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdicts"] = [{**asdict(v), "result": v.word} for v in self.verdicts]
        clean: dict[str, Any] = json_safe(data)
        return clean


# --- targets --------------------------------------------------------------------------------


@dataclass
class WorkersGatewayProcess(GatewayProcess):
    """`tiergate serve --workers N`."""

    workers: int = 2

    def argv(self) -> list[str]:
        return [*super().argv(), "--workers", str(self.workers)]


def workers_probe() -> subprocess.Popen[str]:
    """`tiergate serve --help`, started now and read by `has_workers` (it takes a second or two:
    it runs while the targets start)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tiergate", "serve", "--help"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )  # fmt: skip


def has_workers(probe: subprocess.Popen[str]) -> bool:
    """Whether this tree's `tiergate serve` takes --workers (its help lists the option)."""
    try:
        out, _ = probe.communicate(timeout=120)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    return "--workers" in out


def serve_has_workers() -> bool:
    return has_workers(workers_probe())


def _tree(pid: int) -> Callable[[], list[int]]:
    return lambda: process_tree(pid)


def _version(cmd: Sequence[str]) -> str | None:
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, timeout=30)
    except OSError:
        return None
    text = (proc.stdout + proc.stderr).strip()
    return text.splitlines()[0] if proc.returncode == 0 and text else None


def tiergate_version() -> str:
    """The commit the gateway ran from, marked when the working tree changed its code."""
    repo = REPO
    sha = _version(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    if sha is None:
        return "unknown commit"
    dirty = _version(["git", "-C", str(repo), "status", "--porcelain", "--", "gateway", "tiergate"])
    return f"commit {sha}" + (" + uncommitted changes to gateway/" if dirty else "")


@contextlib.contextmanager
def running_targets(
    opts: Options, workdir: Path, model: str, notes: list[str], console: Console
) -> Iterator[tuple[list[Target], dict[str, str]]]:
    """Start every wanted target that can start (the peers side by side, as they are slow to
    start); yield them in TARGETS order with their versions; stop them all on the way out,
    whatever happens (Ctrl-C included)."""
    wanted = [t for t in TARGETS if t in opts.targets or t == DIRECT]
    venv = opts.venv or default_venv()
    versions = {GATEWAY: tiergate_version()}
    found: dict[str, Target] = {}
    with contextlib.ExitStack() as stack:
        peers = [n for n in wanted if n in PEERS]
        installed = ensure(peers, venv, opts.install, console) if peers else {}
        with console.status("starting the simulator, nginx, the gateways and the peers..."):
            probe = workers_probe() if WORKERS in wanted else None
            if probe is not None:
                stack.callback(has_workers, probe)  # reaped whatever happens
            # The peers start first, on the simulator's port chosen beforehand (LiteLLM takes
            # seconds to import); the routers wait for their worker to answer.
            sim = SimProcess(profile=PROFILE, port=free_port(), log=workdir / "sim.log")
            spawned: list[PeerProcess] = []
            for name in peers:
                inst = installed[name]
                if inst.binary is None:
                    notes.append(f"{name} skipped: {inst.note}")
                    continue
                versions[name] = f"{inst.peer.distribution} {inst.version}"
                policy = opts.peer_policy if inst.peer.policies else None
                peer = PeerProcess(inst.peer, inst.binary, [sim.url], model, workdir, policy)
                stack.callback(peer.stop)
                spawned.append(peer.spawn())
            stack.enter_context(sim)
            found[DIRECT] = Target(DIRECT, sim.url, _tree(sim.pid), log=workdir / "sim.log")
            if "nginx" in wanted:
                binary = nginx_binary()
                if binary is None:
                    notes.append("nginx skipped: nginx is not installed")
                else:
                    ngx = stack.enter_context(NginxProcess(f"127.0.0.1:{sim.port}", binary))
                    found["nginx"] = Target("nginx", ngx.url, _tree(ngx.pid))
                    versions["nginx"] = (_version([binary, "-v"]) or "nginx").split(": ")[-1]
            config = workdir / "gateway.yaml"
            config.write_text(yaml.safe_dump(gateway_config(sim.url, model)))
            if GATEWAY in wanted:
                log = workdir / "gateway.log"
                gw = stack.enter_context(GatewayProcess(config=config, log=log))
                found[GATEWAY] = Target(GATEWAY, gw.url, _tree(gw.pid), log=log)
            if probe is not None:
                if has_workers(probe):
                    log = workdir / "gateway-2w.log"
                    gw2 = stack.enter_context(WorkersGatewayProcess(config=config, log=log))
                    found[WORKERS] = Target(WORKERS, gw2.url, _tree(gw2.pid), log=log)
                    versions[WORKERS] = versions[GATEWAY]
                else:
                    notes.append(f"{WORKERS} skipped: `tiergate serve` has no --workers option "
                                 "in this tree; the target appears once it has")  # fmt: skip
            if GRANIAN in wanted:
                if GranianGatewayProcess.available():
                    log = workdir / "gateway-granian.log"
                    gr = stack.enter_context(GranianGatewayProcess(config=config, log=log))
                    found[GRANIAN] = Target(GRANIAN, gr.url, _tree(gr.pid), log=log)
                    versions[GRANIAN] = f"{versions[GATEWAY]}, granian {gr.version()}"
                else:
                    notes.append(f"{GRANIAN} skipped: granian is not installed, or this tree "
                                 "has no gateway.serve.asgi")  # fmt: skip
            for peer in spawned:
                try:
                    peer.wait_ready()
                except RuntimeError as e:
                    notes.append(f"{peer.peer.name} skipped: did not start: {scrub(str(e), venv)}")
                    peer.stop()
                    continue
                found[peer.peer.name] = Target(peer.peer.name, peer.url, peer.pids, log=peer.log)
        yield [found[n] for n in TARGETS if n in found], versions


# --- measuring ------------------------------------------------------------------------------


async def tokens_per_stream(url: str, body: dict[str, Any]) -> int:
    """The text-carrying events of one streamed completion through `url` (the simulator sends
    one token per event): what one wrk SSE response carries through that target."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=body) as resp,
    ):
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {text[:200]}")
    tokens = 0
    for line in text.splitlines():
        data = line.removeprefix("data:").strip()
        if line.startswith("data:") and data != "[DONE]":
            tokens += sum(1 for c in json.loads(data).get("choices", ()) if c.get("text"))
    return tokens


def _overhead_options(opts: Options) -> overhead.Options:
    return overhead.Options(
        duration_s=opts.duration_s, rounds=opts.rounds, rate=opts.rate,
        wrk_seconds=opts.wrk_seconds, latency_connections=(1, CONNECTIONS),
        stream_connections=(), wrk_connections=CONNECTIONS, wrk_threads=WRK_THREADS,
        wrk_timeout_s=WRK_TIMEOUT_S,
    )  # fmt: skip


def _per_round_ms(rounds: Sequence[Samples]) -> dict[str, list[float]]:
    stats = [Stat.of(s) for s in rounds]
    return {"p50": [s.p50_ms for s in stats], "p99": [s.p99_ms for s in stats]}


def summarize_target(raw: Raw, name: str, tokens: int | None) -> tuple[dict[str, Figure],
                                                                       dict[str, int]]:  # fmt: skip
    """One target's figures (each the median of its rounds') and sample counts."""
    figs: dict[str, Figure] = {}
    counts: dict[str, int] = {}
    for c, suffix in ((1, "1"), (CONNECTIONS, "c")):
        rounds, direct = raw.rounds("latency", c, name), raw.rounds("latency", c, DIRECT)
        ours, ref = _per_round_ms(rounds), _per_round_ms(direct)
        for key, mine in ours.items():
            figs[f"{key}_{suffix}"] = Figure.of(mine)
            if name != DIRECT:
                added = [a - b for a, b in zip(mine, ref[key], strict=True)]
                figs[f"added_{key}_{suffix}"] = Figure.of(added)
        counts[f"n_{suffix}"] = sum(len(s.values) for s in rounds)
        counts[f"errors_{suffix}"] = sum(s.errors for s in rounds)
        if c == CONNECTIONS:
            cpu = Cpu.of(rounds)
            figs["cpu_paced_ms"] = Figure.of(cpu.rounds)
            figs["cpu_paced_sys_ms"] = Figure.of(cpu.system_rounds)
    small = raw.wrk.get(("wrk-small", name), [])
    sse = raw.wrk.get(("wrk-sse", name), [])
    if small:
        figs["rps"] = Figure.of([w.requests_per_s for w in small])
        figs["cpu_ms"] = Figure.of([ratio(1000 * w.server_cpu_s, w.requests) for w in small])
        counts["wrk_requests"] = sum(w.requests for w in small)
        counts["wrk_errors"] = sum(w.errors for w in small)
    if sse and tokens is not None:
        figs["sse_tokens_s"] = Figure.of([w.requests_per_s * tokens for w in sse])
        figs["sse_cpu_ms"] = Figure.of([ratio(1000 * w.server_cpu_s, w.requests) for w in sse])
        figs["sse_sys_ms"] = Figure.of([ratio(1000 * w.server_system_s, w.requests) for w in sse])
        counts["sse_streams"] = sum(w.requests for w in sse)
        counts["sse_errors"] = sum(w.errors for w in sse)
    return figs, counts


def _fmt(v: float, unit: str = "ms") -> str:
    if math.isnan(v):
        return "-"
    return f"{v:.3f}" if unit == "ms" else f"{v:,.0f}"


def _noise_note(name: str, rounds: Sequence[float], limit: float) -> str | None:
    """A note when the rounds themselves disagree about a limit."""
    if len({v <= limit for v in rounds if not math.isnan(v)}) > 1:
        shown = " / ".join(_fmt(v) for v in rounds)
        return (f"{name}: the rounds disagree (per round {shown}): that verdict is within this "
                "run's noise; more rounds or longer cells narrow it")  # fmt: skip
    return None


def verdicts(report: Report) -> tuple[list[Verdict], list[str]]:
    """The goals, from the measured medians: tiergate's CPU per request and added p50 at 1
    connection under their limits, and tiergate ahead of LiteLLM on every figure."""
    out: list[Verdict] = []
    notes: list[str] = []
    gw = report.figures.get(GATEWAY, {})
    for key, limit, what in (
        ("cpu_ms", MAX_CPU_MS, f"tiergate CPU per request (wrk, {CONNECTIONS} conns)"),
        ("added_p50_1", MAX_ADDED_P50_1_MS, "tiergate added p50 at 1 connection"),
    ):
        fig = gw.get(key)
        value = fig.value if fig is not None else math.nan
        measured = "-" if math.isnan(value) else f"{value:.3f} ms"
        out.append(Verdict(what, f"<= {limit:g} ms", measured,
                           None if math.isnan(value) else value <= limit))  # fmt: skip
        if fig is not None and (n := _noise_note(what, fig.rounds, limit)):
            notes.append(n)
    rival = report.figures.get(RIVAL)
    mets: list[bool | None] = []
    for spec in FIGURES:
        mine, theirs = gw.get(spec.key), (rival or {}).get(spec.key)
        name = f"tiergate vs LiteLLM: {spec.label}"
        if mine is None or theirs is None or math.isnan(mine.value) or math.isnan(theirs.value):
            out.append(Verdict(name, f"{spec.better} than LiteLLM's", "-", None))
            mets.append(None)
            continue

        def ahead(a: float, b: float, better: str = spec.better) -> bool:
            return a < b if better == "lower" else a > b

        met = ahead(mine.value, theirs.value)
        mets.append(met)
        unit = spec.unit
        measured = (f"{_fmt(mine.value, unit)} vs {_fmt(theirs.value, unit)} {unit} "
                    f"({_x(ratio(mine.value, theirs.value))})")  # fmt: skip
        out.append(Verdict(name, f"{spec.better} than LiteLLM's", measured, met))
        per_round = [ahead(a, b) for a, b in zip(mine.rounds, theirs.rounds, strict=False)]
        if len(set(per_round)) > 1:
            notes.append(f"{name}: the rounds disagree (tiergate ahead in {sum(per_round)} of "
                         f"{len(per_round)}): within this run's noise")  # fmt: skip
    overall: bool | None = None if None in mets else all(mets)
    measured = "-" if overall is None else f"ahead on {sum(1 for m in mets if m)} of {len(mets)}"
    out.append(Verdict("tiergate ahead of LiteLLM on every figure", "all of the above",
                       measured, overall))  # fmt: skip
    return out, notes


def stream_notes(report: Report, wrk_seconds: int) -> list[str]:
    """wrk counts whole responses only: a target too slow to finish a stream within a run
    shows none, which says that much and no more."""
    return [
        f"{name} completed no {SSE_TOKENS}-token stream within a {wrk_seconds} s wrk run at "
        f"{CONNECTIONS} connections: its SSE figure is 0 (a longer --wrk-seconds measures it)"
        for name in report.targets
        if "sse_streams" in report.counts[name] and report.counts[name]["sse_streams"] == 0
    ]


def sse_bound_notes(report: Report) -> list[str]:
    """Where streams through a proxy outrun the simulator called directly, the SSE figure is
    not the proxy's ceiling: say what bounds it."""
    direct = report.value(DIRECT, "sse_tokens_s")
    faster = [n for n in report.targets if report.value(n, "sse_tokens_s") > direct]
    if not faster:
        return []
    return [
        f"SSE tokens/s through {', '.join(faster)} exceed direct's ({direct:,.0f}): wrk, the "
        "simulator and the proxy share the CPUs, and a proxy may change how the events reach wrk "
        "(how many per read), so this figure is bounded by the machine, not by one proxy alone; "
        "the CPU per stream compares the proxies' own cost"
    ]


def capacity_notes(report: Report, rate: float) -> list[str]:
    """Where a target's own throughput (wrk) is below the paced load's rate, its latency at 64
    connections is queueing behind its capacity, not a proxy hop's cost: say so."""
    notes = []
    for name in report.targets:
        rps = report.value(name, "rps")
        if not math.isnan(rps) and rps < rate:
            notes.append(
                f"{name} served {rps:,.0f} req/s under wrk, below the paced load's {rate:g} "
                f"req/s: its latency at {CONNECTIONS} connections is mostly queueing (an open "
                "loop charges each request from its scheduled start)"
            )
    return notes


def failure_notes(report: Report, targets: Sequence[Target], venv: Path) -> list[str]:
    notes = []
    for t in targets:
        c = report.counts.get(t.name, {})
        failed = {k: v for k, v in c.items() if k.endswith("errors") and v}
        if not failed or t.log is None:
            continue
        try:
            lines = [x.strip()[:240] for x in t.log.read_text(errors="replace").splitlines()]
        except OSError:
            lines = []
        tail = " | ".join(x for x in lines if x)[-480:]
        listed = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in failed.items())
        notes.append(scrub(f"{t.name} failed requests ({listed}); its log ends: {tail}", venv))
    return notes


def run(opts: Options, console: Console | None = None) -> Report:
    """Install what is missing, start the targets, measure, stop them; print the tables and
    write JSON, markdown and PNG."""
    console = console or Console()
    command = opts.command or shlex.join(["tiergate", *sys.argv[1:]])
    notes: list[str] = []
    model = load_profile(PROFILE).model
    wrk_bin = shutil.which("wrk")
    if opts.wrk_seconds <= 0:
        notes.append("wrk part skipped (--wrk-seconds 0): no req/s, CPU per request or SSE figure")
    elif wrk_bin is None:
        notes.append("wrk part skipped: wrk is not installed (e.g. apt-get install wrk): no "
                     "req/s, CPU per request or SSE figure")  # fmt: skip
    sse_body = stream_body(model, SSE_TOKENS, usage=False)
    with tempfile.TemporaryDirectory(prefix="tiergate-peers-") as tmp:
        workdir = Path(tmp)
        wrk: tuple[str, Path, Path] | None = None
        if wrk_bin is not None and opts.wrk_seconds > 0:
            small_lua, sse_lua = workdir / "post.lua", workdir / "post-sse.lua"
            small_lua.write_text(wrk_script(small_body(model)))
            sse_lua.write_text(wrk_script(sse_body))
            wrk = (wrk_bin, small_lua, sse_lua)
        with contextlib.ExitStack() as stack:
            targets, versions = stack.enter_context(
                running_targets(opts, workdir, model, notes, console)
            )
            for note in notes:
                console.print(f"[yellow]note:[/] {note}")
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TimeRemainingColumn())  # fmt: skip
            progress = stack.enter_context(Progress(*columns, console=console, transient=True))
            runner = stack.enter_context(event_loop_runner())
            tokens = {
                t.name: runner.run(tokens_per_stream(t.url + "/v1/completions", sse_body))
                for t in targets
            }
            raw = runner.run(overhead.measure(targets, _overhead_options(opts), model, wrk,
                                              progress))  # fmt: skip
        report = summarize(raw, targets, opts, notes, command, versions, tokens)
        report.notes += failure_notes(report, targets, opts.venv or default_venv())
    print_report(report, console)
    write_outputs(report, opts, console)
    return report


def summarize(
    raw: Raw,
    targets: Sequence[Target],
    opts: Options,
    notes: list[str],
    command: str,
    versions: dict[str, str],
    tokens: dict[str, int],
) -> Report:
    names = [t.name for t in targets]
    for name, n in tokens.items():
        if n != SSE_TOKENS:
            notes.append(f"{name} carried {n} tokens of a {SSE_TOKENS}-token stream; its SSE "
                         "tokens/s counts what it carried")  # fmt: skip
    figures, counts = {}, {}
    for name in names:
        figures[name], counts[name] = summarize_target(raw, name, tokens.get(name))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    settings.pop("venv")  # a folder of this machine
    settings.update(profile=PROFILE, connections=CONNECTIONS, sse_tokens=SSE_TOKENS,
                    wrk_threads=WRK_THREADS)  # fmt: skip
    report = Report(
        command=command,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        nproc=os.cpu_count() or 0,
        machine=f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        settings=settings,
        targets=names,
        versions=versions,
        notes=notes,
        figures=figures,
        counts=counts,
        tokens_per_stream=tokens,
    )
    report.verdicts, noise = verdicts(report)
    report.notes += noise + capacity_notes(report, opts.rate)
    report.notes += stream_notes(report, opts.wrk_seconds) + sse_bound_notes(report)
    return report


# --- output ---------------------------------------------------------------------------------


def _x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}x"


def _cell(report: Report, name: str, key: str) -> str:
    if name == DIRECT and key.startswith("added_"):
        return "(ref)"
    return _fmt(report.value(name, key), SPECS[key].unit)


def _head(spec: Spec) -> str:
    return spec.label if spec.unit in spec.label else f"{spec.label} ({spec.unit})"


def figure_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["target", *(_head(s) for s in FIGURES),
            "samples 1 conn / 64 conns / wrk / SSE", "errors"]  # fmt: skip
    rows = []
    for name in report.targets:
        c = report.counts[name]
        samples = " / ".join(f"{c.get(k, 0):,}" for k in ("n_1", "n_c", "wrk_requests",
                                                          "sse_streams"))  # fmt: skip
        errors = sum(v for k, v in c.items() if k.endswith("errors"))
        rows.append([name, *(_cell(report, name, s.key) for s in FIGURES), samples, str(errors)])
    return head, rows


def ratio_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["target", *(s.label for s in FIGURES)]
    rows = []
    for name in report.targets:
        if name in (DIRECT, GATEWAY):
            continue
        cells = []
        for s in FIGURES:
            ours, theirs = report.value(GATEWAY, s.key), report.value(name, s.key)
            cells.append(_x(ratio(theirs, ours)))
        rows.append([name, *cells])
    return head, rows


def absolute_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["target", *(_head(s) for s in EXTRA), "tokens/stream"]
    rows = []
    for name in report.targets:
        tokens = report.tokens_per_stream.get(name)
        rows.append([name, *(_cell(report, name, s.key) for s in EXTRA),
                     "-" if tokens is None else str(tokens)])  # fmt: skip
    return head, rows


def round_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["target", "figure", "median", "per round"]
    rows = []
    for name in report.targets:
        for s in FIGURES:
            fig = report.figures[name].get(s.key)
            if fig is None:
                continue
            rows.append([name, _head(s), _fmt(fig.value, s.unit),
                         " / ".join(_fmt(v, s.unit) for v in fig.rounds)])  # fmt: skip
    return head, rows


def verdict_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["goal", "target", "measured", "verdict"]
    return head, [[v.name, v.target, v.measured, v.word] for v in report.verdicts]


def sections(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    return [
        ("Goals", *verdict_rows(report)),
        (f"Figures (median of rounds: {report.settings['rounds']})", *figure_rows(report)),
        ("Against tiergate (target's figure / tiergate's)", *ratio_rows(report)),
        ("Latency and CPU, absolute (median of rounds)", *absolute_rows(report)),
        ("Each round's value", *round_rows(report)),
    ]


def print_report(report: Report, console: Console) -> None:
    styles = {"MET": "bold green", "NOT MET": "bold red", "NOT MEASURED": "bold yellow"}
    for title, head, rows in sections(report):
        if title.startswith("Each round"):
            continue  # in the markdown only
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="left" if h in ("target", "goal", "figure") else "right")
        for row in rows:
            table.add_row(*row, style=styles.get(row[-1]) if title == "Goals" else None)
        console.print(table)
    for v in report.verdicts:
        console.print(f"[{styles[v.word]}]{v.word}[/]: {v.name} = {v.measured} (target {v.target})")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")


def markdown(report: Report, chart_file: Path | None) -> str:
    s = report.settings
    parts = [
        "# tiergate against its peers: the cost of the proxy hop",
        "",
        f"- Command: `{report.command}`",
        f"- Date: {report.date}",
        f"- Machine: `nproc` = {report.nproc} ({report.machine}); the client, the simulator and "
        "every target share these CPUs.",
        f"- Versions: {', '.join(f'{k}: {v}' for k, v in report.versions.items())}",
        "- Targets, each in front of the same `instant` simulator (no model time) on loopback:",
        *(f"  - `{n}`: {DESCRIPTIONS[n]}" for n in report.targets),
        f"- vllm-router and smg route with `--policy {s['peer_policy']}` (one worker: the policy "
        "only costs); every target logs at warning level (no line per request).",
        f"- Rounds: {s['rounds']}, the targets' order rotating; per round and target "
        f"{s['duration_s']:g} s of small requests at 1 connection (closed loop) and at "
        f"{CONNECTIONS} (open loop at {s['rate']:g} req/s, each latency timed from its scheduled "
        f"start), then `wrk -t{WRK_THREADS} -c{CONNECTIONS} -d{s['wrk_seconds']}s "
        f"--timeout={WRK_TIMEOUT_S}s` of small "
        f"requests and of {SSE_TOKENS}-token SSE streams.",
        "- Added = the target's percentile minus direct's in the same round. CPU ms/request: "
        "user + system CPU of every process of the target (its process tree, /proc) over the wrk "
        "run, divided by the requests wrk completed; the paced cell's and a stream's the same way, "
        "and beside them the system's part of it (the kernel's work on the process's behalf: "
        "the sockets, waking). SSE tokens/s: wrk's streams/s x the tokens "
        "one stream carried through that target. Every figure is the median of the rounds' "
        "values (each round's in the last table).",
        "- Goals: tiergate's CPU per request <= "
        f"{MAX_CPU_MS:g} ms and its added p50 at 1 connection <= {MAX_ADDED_P50_1_MS:g} ms; "
        "tiergate ahead of LiteLLM on every figure.",
    ]
    chart = None if chart_file is None else (chart_file, "latency, throughput and CPU per target")
    return finish_markdown(parts, report.notes, sections(report), chart)


def chart(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    names = report.targets
    colors = {DIRECT: "tab:blue", "nginx": "tab:green", GATEWAY: "tab:orange",
              WORKERS: "tab:red", GRANIAN: "tab:olive", "vllm-router": "tab:purple",
              "smg": "tab:brown", "litellm": "tab:gray"}  # fmt: skip
    panels = (
        ("latency, 1 conn: p50 (p99 pale), ms", "p50_1", "p99_1", True),
        (f"latency, {CONNECTIONS} conns paced: p50 (p99 pale), ms", "p50_c", "p99_c", True),
        (f"req/s, {CONNECTIONS} conns (wrk)", "rps", None, False),
        ("CPU ms/request of the target (wrk; direct: the simulator's)", "cpu_ms", None, True),
        (f"SSE tokens/s ({SSE_TOKENS}-token streams, wrk)", "sse_tokens_s", None, False),
        ("CPU ms per stream of the target (wrk)", "sse_cpu_ms", None, True),
    )
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    # Minor ticks labelled at 2 and 5 of each decade only: more crowd a scale of many decades.
    some = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
    for ax, (title, key, pale, log) in zip(axes.flat, panels, strict=True):
        xs = range(len(names))
        color = [colors.get(n, "tab:cyan") for n in names]
        if pale is not None:
            ax.bar(xs, [report.value(n, pale) for n in names], 0.8, color=color, alpha=0.35)
        ax.bar(xs, [report.value(n, key) for n in names], 0.5, color=color)
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(some)
            ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"tiergate and its peers, one instant simulator behind each "
                 f"({report.date}, nproc={report.nproc})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(report: Report, opts: Options, console: Console) -> None:
    save(report, opts, console, chart, markdown)


# -- the command ------------------------------------------------------------------------------


def _peer_targets(names: list[str] | None) -> list[str] | None:
    from loadtests.peers import TARGETS

    return known(names, TARGETS)


def command(
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (targets in rotating order).")] = 3,
    duration: Annotated[
        float, typer.Option(min=0.1, help="Seconds per latency cell per target per round.")
    ] = 3.0,
    rate: Annotated[
        float, typer.Option(min=1, help="Aggregate req/s of the paced load at 64 connections.")
    ] = 400.0,
    wrk_seconds: Annotated[
        int, typer.Option(min=0, help="Each wrk run (small, SSE) per target per round; 0 skips.")
    ] = 5,
    target: Annotated[
        list[str] | None,
        typer.Option(
            callback=_peer_targets,
            help="Targets to run; repeat for several (default all: direct, nginx, tiergate, "
            "tiergate-2w, tiergate-granian, vllm-router, smg, litellm). direct always runs: "
            "it is the reference.",
        ),
    ] = None,
    peers_venv: Annotated[Path | None, typer.Option(help=PEERS_VENV_HELP)] = None,
    install: Annotated[
        bool,
        typer.Option(
            help="Install missing peers (pip, into the peers' venv, one package at a time); "
            "--no-install skips them with a note instead."
        ),
    ] = True,
    peer_policy: Annotated[
        str,
        typer.Option(
            help="vllm-router's and smg's --policy (one worker: it only costs; round_robin "
            "costs least)."
        ),
    ] = "round_robin",
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/peers.json"),
) -> None:
    """tiergate against its peers as a proxy hop, in one run: vLLM's router (vllm-router),
    SGLang's model gateway (smg), LiteLLM's proxy, nginx (the floor) and tiergate with one
    worker and with --workers 2 (when `serve` has it), each in front of the same instant
    simulator, called also directly. Per target, the median of the rounds: added latency p50/p99
    at 1 and 64 connections, req/s at 64 connections (wrk), the proxy's CPU per request (all its
    processes, over the wrk run), SSE tokens/s, errors and sample counts; ratios against
    tiergate, and the goals (tiergate CPU/request <= 0.30 ms, added p50 at 1 connection <= 0.5
    ms, ahead of LiteLLM on every figure) as MET / NOT MET. The peers live in a virtual
    environment of their own, installed on first use; one that cannot be installed or started
    is left out with a note. Every process is stopped at the end, on failure and on Ctrl-C."""
    import sys

    from loadtests.common.report import command_line
    from loadtests.harness.peerenv import PEERS

    choices = PEERS["vllm-router"].policies
    if peer_policy not in choices:
        raise typer.BadParameter(f"{peer_policy}: choose from {', '.join(choices)}")
    setup_logging("warning")
    opts = Options(
        rounds=rounds, duration_s=duration, rate=rate, wrk_seconds=wrk_seconds,
        targets=tuple(target or TARGETS), venv=peers_venv, install=install,
        peer_policy=peer_policy, out=out,
        command=command_line(without(sys.argv[1:], "--peers-venv")),
    )  # fmt: skip
    try:
        run(opts)
    except KeyboardInterrupt:  # the processes are stopped by then; no traceback for a Ctrl-C
        typer.echo("interrupted: every process stopped, nothing written", err=True)
        raise typer.Exit(130) from None
