"""`tiergate bench overhead`: what the gateway itself adds, against the same simulator called
directly and through nginx (a plain compiled reverse proxy: the floor for any proxy hop).

One `instant` simulator (no model time: tokens come as fast as its event loop produces them)
sits behind three targets: `direct` (the simulator), `nginx` (nginx -> simulator) and `gateway`
(`tiergate serve`, one worker, one throughput tier holding that simulator). Every measurement runs
on every target in rounds, the targets' order rotating from round to round, and the samples pool
over rounds, so that drift on a shared machine (other processes, thermal, caches) spreads evenly
over the targets instead of landing on one of them.

1. Latency of small non-streamed requests at 1 connection (closed loop) and at 64 and 256
   connections under an open-loop paced load of a fixed aggregate rate: each connection sends on
   its own schedule and a late request is timed from its scheduled start (no coordinated
   omission), so the figure is the proxy's cost rather than queueing at saturation.
2. TTFT of streams (first chunk carrying text), closed loop at 1 and 64 streams.
3. Throughput with wrk: small requests/s and SSE chunks/s.

Every latency and TTFT cell also reports the CPU the serving process used per completed request
(/proc, over the timed window only): the gateway's own pid, nginx's worker, the simulator for
`direct`.

With a baseline (a git ref), that commit's code is extracted into a temporary folder and its
gateway runs as one more target, `gateway@<short sha>`, in front of the same simulator with the
same config, so that a change to the gateway is judged against the code before it in one run,
under the same machine conditions: its added p50 and CPU per request side by side.

The client runs in this process on the same machine: its own cost is in every figure, equally
for every target, which is why the gateway is reported as *added* latency (target - direct).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

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
from loadtests.common.options import setup_logging
from loadtests.common.report import OutputPaths, finish_markdown, save
from loadtests.common.stats import (
    Added,
    Cpu,
    Samples,
    Stat,
    cpu_spent,
    cpu_split,
    json_safe,
    ms,
    ratio,
    rotation,
)
from loadtests.harness.baseline import (
    Baseline,
    baseline_gateway,
    checkout,
    code_folder,
    git,
    import_origins,
)
from loadtests.harness.client import event_loop_runner
from loadtests.harness.nginx import NginxProcess, nginx_binary
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import (
    PROFILE,
    SSE_TOKENS,
    STREAM_TOKENS,
    Target,
    closed_small,
    closed_ttft,
    count_events,
    gateway_config,
    paced_small,
    parse_wrk,
    small_body,
    stream_body,
    wrk_script,
)

TARGETS = ("direct", "nginx", "gateway")
PROXIES = ("nginx", "gateway")  # plus the baseline's gateway, `gateway@<sha>`, when there is one

# The targets the verdict is judged against (per gateway worker).
MAX_ADDED_P50_MS = 1.0
MAX_ADDED_P99_MS = 5.0
VERDICT_CONNECTIONS = 64
MIN_REQUESTS_PER_S = 1500.0
MIN_CHUNKS_PER_S = 20000.0
# Against a baseline commit: no worse than 5% above it.
MAX_BASELINE_RATIO = 1.05


Part = Literal["latency", "ttft", "wrk-small", "wrk-sse"]




@dataclass(frozen=True)
class Options(OutputPaths):
    duration_s: float = 3.0  # per target per round, for each latency and TTFT cell
    rounds: int = 3
    rate: float = 400.0  # aggregate req/s of the paced load
    wrk_seconds: int = 5  # 0 skips the wrk part
    out: Path = Path("docs/results/overhead.json")
    latency_connections: tuple[int, ...] = (1, 64, 256)
    stream_connections: tuple[int, ...] = (1, 64)
    wrk_connections: int = 64
    wrk_threads: int = 2
    # wrk counts a response slower than this as a timeout error (it still completes); None: wrk's
    # own 2 s, ample for the gateway, not for a proxy that queues streams for longer.
    wrk_timeout_s: int | None = None
    use_nginx: bool = True
    chart: bool = True
    command: str | None = None  # as shown in the markdown; default: this process's argv
    baseline: str | None = None  # a git ref whose gateway runs as one more target


# --- statistics ---------------------------------------------------------------------------






def is_proxy(name: str) -> bool:
    return name in PROXIES or name.startswith("gateway@")












@dataclass(frozen=True)
class LatencyCell:
    concurrency: int
    load: str  # "closed loop" or "open loop, N req/s"
    stats: dict[str, Stat]  # pooled over rounds
    added: dict[str, Added]
    cpu: dict[str, Cpu]
    round_p50_ms: dict[str, list[float]]  # each round's own p50, to show the spread


@dataclass(frozen=True)
class WrkRun:
    requests_per_s: float
    requests: int
    errors: int  # non-2xx answers plus socket errors
    server_cpu_cores: float  # CPU of the process wrk talks to (nginx: its worker)
    server_cpu_s: float = 0.0  # the same, in CPU seconds over the run
    server_system_s: float = 0.0  # of it, the system's


@dataclass(frozen=True)
class WrkStat:
    requests_per_s: float  # mean over rounds (equal durations: the pooled rate)
    rounds: list[float]
    requests: int
    errors: int
    server_cpu_cores: float
    events_per_response: int | None = None  # SSE only: `data:` events in one response
    chunks_per_s: float | None = None

    @classmethod
    def of(cls, runs: Sequence[WrkRun], events: int | None) -> WrkStat:
        rps = sum(r.requests_per_s for r in runs) / len(runs)
        return cls(
            requests_per_s=rps,
            rounds=[r.requests_per_s for r in runs],
            requests=sum(r.requests for r in runs),
            errors=sum(r.errors for r in runs),
            server_cpu_cores=sum(r.server_cpu_cores for r in runs) / len(runs),
            events_per_response=events,
            chunks_per_s=rps * events if events is not None else None,
        )


@dataclass(frozen=True)
class Verdict:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured

    @property
    def word(self) -> str:
        return {True: "MET", False: "NOT MET", None: "NOT MEASURED"}[self.met]




@dataclass(frozen=True)
class Comparison:
    """The working tree's gateway against the baseline's in one latency cell. Added p50 is pooled
    over rounds (as in the latency table); CPU per request is the median over rounds; the
    per-round ratios compare the two gateways within the same round."""

    concurrency: int
    load: str
    n_new: int
    n_old: int
    errors_new: int
    errors_old: int
    added_p50_new_ms: float
    added_p50_old_ms: float
    added_p50_ratio: float
    added_p50_rounds_new: list[float]
    added_p50_rounds_old: list[float]
    added_p50_round_ratios: list[float]
    cpu_new_ms: float
    cpu_old_ms: float
    cpu_ratio: float
    cpu_rounds_new: list[float]
    cpu_rounds_old: list[float]
    cpu_round_ratios: list[float]

    @classmethod
    def of(cls, cell: LatencyCell, new: str, old: str) -> Comparison:
        def added_rounds(name: str) -> list[float]:
            direct = cell.round_p50_ms["direct"]
            return [p - d for p, d in zip(cell.round_p50_ms[name], direct, strict=True)]

        def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
            return [ratio(x, y) for x, y in zip(a, b, strict=True)]

        a_new, a_old = added_rounds(new), added_rounds(old)
        c_new, c_old = cell.cpu[new], cell.cpu[old]
        return cls(
            concurrency=cell.concurrency,
            load=cell.load,
            n_new=cell.stats[new].n,
            n_old=cell.stats[old].n,
            errors_new=cell.stats[new].errors,
            errors_old=cell.stats[old].errors,
            added_p50_new_ms=cell.added[new].p50_ms,
            added_p50_old_ms=cell.added[old].p50_ms,
            added_p50_ratio=ratio(cell.added[new].p50_ms, cell.added[old].p50_ms),
            added_p50_rounds_new=a_new,
            added_p50_rounds_old=a_old,
            added_p50_round_ratios=ratios(a_new, a_old),
            cpu_new_ms=c_new.ms_per_request,
            cpu_old_ms=c_old.ms_per_request,
            cpu_ratio=ratio(c_new.ms_per_request, c_old.ms_per_request),
            cpu_rounds_new=c_new.rounds,
            cpu_rounds_old=c_old.rounds,
            cpu_round_ratios=ratios(c_new.rounds, c_old.rounds),
        )


@dataclass
class Report:
    command: str
    date: str
    nproc: int
    machine: str
    settings: dict[str, Any]
    targets: list[str]
    notes: list[str]
    latency: list[LatencyCell]
    ttft: list[LatencyCell]
    wrk_small: dict[str, WrkStat] | None
    wrk_sse: dict[str, WrkStat] | None
    verdicts: list[Verdict]
    sources: dict[str, str] = field(default_factory=dict)  # gateway target -> code folder
    baseline: Baseline | None = None
    vs_baseline: list[Comparison] = field(default_factory=list)
    baseline_verdicts: list[Verdict] = field(default_factory=list)

    def _ran(self, name: str) -> str:
        b = self.baseline
        return f"commit {b.sha}" if b is not None and name == b.name else "working tree"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdicts"] = [{**asdict(v), "result": v.word} for v in self.verdicts]
        data["baseline_verdicts"] = [
            {**asdict(v), "result": v.word} for v in self.baseline_verdicts
        ]
        if self.baseline is not None:
            data["baseline"]["name"] = self.baseline.name
        # The folders are this machine's (one of them temporary, gone by now): the results
        # name whose code each gateway ran instead.
        data.pop("sources")
        data["ran"] = {name: self._ran(name) for name in self.sources}
        if self.baseline is not None:
            del data["baseline"]["folder"]
        clean: dict[str, Any] = json_safe(data)
        return clean


# --- targets --------------------------------------------------------------------------------


















@contextlib.contextmanager
def running_targets(
    workdir: Path,
    model: str,
    notes: list[str],
    use_nginx: bool = True,
    baseline: Baseline | None = None,
) -> Iterator[list[Target]]:
    """Start the simulator, nginx in front of it (when installed), the gateway and the baseline's
    gateway (when given); stop them all on the way out, whatever happens (Ctrl-C included)."""
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(SimProcess(profile=PROFILE, log=workdir / "sim.log"))
        targets = [Target("direct", sim.url, lambda: [sim.pid])]
        binary = nginx_binary() if use_nginx else None
        if binary is None:
            notes.append(
                "nginx target skipped: "
                + ("nginx is not installed" if use_nginx else "disabled by option")
            )
        else:
            ngx = stack.enter_context(NginxProcess(f"127.0.0.1:{sim.port}", binary))
            targets.append(Target("nginx", ngx.url, ngx.worker_pids))
        config = workdir / "gateway.yaml"
        config.write_text(yaml.safe_dump(gateway_config(sim.url, model)))
        # Probed with this process's cwd and environment, which the launcher passes on.
        source = code_folder(import_origins(["gateway"]))
        log = workdir / "gateway.log"
        gw = stack.enter_context(GatewayProcess(config=config, log=log))
        targets.append(Target("gateway", gw.url, lambda: [gw.pid], str(source), log))
        if baseline is not None:
            log = workdir / f"gateway-{baseline.short}.log"
            targets.append(stack.enter_context(baseline_gateway(baseline, config, log)))
        yield targets


# --- load generators ------------------------------------------------------------------------




















# --- wrk ------------------------------------------------------------------------------------






async def run_wrk(
    binary: str, target: Target, script: Path, seconds: int, connections: int, threads: int,
    timeout_s: int | None = None,
) -> WrkRun:  # fmt: skip
    pids = target.server_pids()
    cmd = [binary, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "-s", str(script),
           *([f"--timeout={timeout_s}s"] if timeout_s else []),
           target.url + "/v1/completions"]  # fmt: skip
    c0, t0 = cpu_split(pids), time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        stdout, _ = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled (Ctrl-C): do not leave wrk running
            proc.kill()
            await proc.wait()
    cpu_s, system_s = cpu_spent(c0, cpu_split(pids))
    cores = cpu_s / (time.perf_counter() - t0)
    output = stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}:\n{output}")
    rps, requests, errors = parse_wrk(output)
    return WrkRun(rps, requests, errors, cores, cpu_s, system_s)


# --- the benchmark --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    part: Part
    concurrency: int

    @property
    def label(self) -> str:
        return {
            "latency": f"latency c={self.concurrency}",
            "ttft": f"TTFT c={self.concurrency}",
            "wrk-small": f"wrk small c={self.concurrency}",
            "wrk-sse": f"wrk SSE c={self.concurrency}",
        }[self.part]




@dataclass
class Raw:
    """Everything measured, before it is summarized."""

    samples: dict[tuple[Part, int, str], list[Samples]] = field(default_factory=dict)  # per round
    wrk: dict[tuple[Part, str], list[WrkRun]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)

    def rounds(self, part: Part, concurrency: int, target: str) -> list[Samples]:
        return self.samples.setdefault((part, concurrency, target), [])


async def measure(
    targets: list[Target],
    opts: Options,
    model: str,
    wrk: tuple[str, Path, Path] | None,
    progress: Progress,
) -> Raw:
    """Every cell on every target, round after round, the targets' order rotating each round."""
    raw = Raw()
    by_name = {t.name: t for t in targets}
    small = json.dumps(small_body(model)).encode()
    ttft_body = stream_body(model, STREAM_TOKENS, usage=True)
    cells = [Cell("latency", c) for c in opts.latency_connections]
    cells += [Cell("ttft", c) for c in opts.stream_connections]
    if wrk is not None:
        cells += [Cell("wrk-small", opts.wrk_connections), Cell("wrk-sse", opts.wrk_connections)]
        sse = stream_body(model, SSE_TOKENS, usage=False)
        for t in targets:
            raw.events[t.name] = await count_events(t.url + "/v1/completions", sse)
    task = progress.add_task("overhead", total=opts.rounds * len(cells) * len(targets))
    for r in range(opts.rounds):
        for cell in cells:
            for name in rotation([t.name for t in targets], r):
                target = by_name[name]
                url = target.url + "/v1/completions"
                progress.update(
                    task, description=f"round {r + 1}/{opts.rounds}  {cell.label:<18} {name}"
                )
                c = cell.concurrency
                pids = target.server_pids()
                if cell.part == "latency":
                    s = (
                        await closed_small(url, small, c, opts.duration_s, pids)
                        if c == 1
                        else await paced_small(url, small, c, opts.rate, opts.duration_s, pids)
                    )
                elif cell.part == "ttft":
                    s = await closed_ttft(url, ttft_body, c, opts.duration_s, pids)
                else:
                    assert wrk is not None
                    binary, small_lua, sse_lua = wrk
                    script = small_lua if cell.part == "wrk-small" else sse_lua
                    seconds = opts.wrk_seconds
                    run = await run_wrk(binary, target, script, seconds, c, opts.wrk_threads,
                                        opts.wrk_timeout_s)  # fmt: skip
                    while run.requests == 0 and seconds < 8 * opts.wrk_seconds:
                        # Not one answer in the window (a machine this busy): a run twice as
                        # long replaces it, rather than a rate of 0 that measured nothing.
                        seconds *= 2
                        run = await run_wrk(binary, target, script, seconds, c,
                                            opts.wrk_threads, opts.wrk_timeout_s)  # fmt: skip
                    raw.wrk.setdefault((cell.part, name), []).append(run)
                    progress.advance(task)
                    continue
                raw.rounds(cell.part, c, name).append(s)
                progress.advance(task)
    return raw


def _latency_cells(
    raw: Raw, part: Part, conns: Sequence[int], names: list[str], opts: Options
) -> list[LatencyCell]:
    cells = []
    for c in conns:
        rounds = {n: raw.rounds(part, c, n) for n in names}
        stats = {n: Stat.of(Samples.pool(rounds[n])) for n in names}
        added = {n: Added.of(stats[n], stats["direct"]) for n in names if is_proxy(n)}
        cpu = {n: Cpu.of(rounds[n]) for n in names}
        round_p50 = {n: [Stat.of(s).p50_ms for s in rounds[n]] for n in names}
        closed = part == "ttft" or c == 1
        load = "closed loop" if closed else f"open loop, {opts.rate:g} req/s"
        cells.append(LatencyCell(c, load, stats, added, cpu, round_p50))
    return cells


def verdicts(report: Report) -> list[Verdict]:
    out: list[Verdict] = []
    cell = next((c for c in report.latency if c.concurrency == VERDICT_CONNECTIONS), None)
    added = cell.added.get("gateway") if cell else None
    for what, limit in (("p50", MAX_ADDED_P50_MS), ("p99", MAX_ADDED_P99_MS)):
        value = getattr(added, f"{what}_ms") if added else math.nan
        out.append(
            Verdict(
                f"gateway added {what} at {VERDICT_CONNECTIONS} connections",
                f"<= {limit:g} ms",
                f"{value:.3f} ms" if not math.isnan(value) else "-",
                None if math.isnan(value) else value <= limit,
            )
        )
    small = report.wrk_small.get("gateway") if report.wrk_small else None
    out.append(
        Verdict(
            "proxied requests/s, one gateway worker",
            f">= {MIN_REQUESTS_PER_S:,.0f}",
            f"{small.requests_per_s:,.0f}" if small else "-",
            small.requests_per_s >= MIN_REQUESTS_PER_S if small else None,
        )
    )
    sse = report.wrk_sse.get("gateway") if report.wrk_sse else None
    chunks = sse.chunks_per_s if sse else None
    out.append(
        Verdict(
            "SSE chunks/s, one gateway worker",
            f">= {MIN_CHUNKS_PER_S:,.0f}",
            f"{chunks:,.0f}" if chunks is not None else "-",
            chunks >= MIN_CHUNKS_PER_S if chunks is not None else None,
        )
    )
    return out


def _ratio_x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3f}x"


def baseline_verdicts(report: Report) -> tuple[list[Verdict], list[str]]:
    """The criterion against the baseline, at the 64-connection paced cell: the gateway's CPU per
    request and its added p50 no worse than 5% above the baseline's; the same at 1 connection
    for information. Notes say where the rounds themselves disagree about the margin."""
    assert report.baseline is not None
    out: list[Verdict] = []
    notes: list[str] = []
    by_conns = {c.concurrency: c for c in report.vs_baseline}
    for conns in (VERDICT_CONNECTIONS, 1):
        comp = by_conns.get(conns)
        if comp is None:
            continue
        for what, new, old, times, per_round in (
            ("CPU ms/request", comp.cpu_new_ms, comp.cpu_old_ms, comp.cpu_ratio,
             comp.cpu_round_ratios),
            ("added p50", comp.added_p50_new_ms, comp.added_p50_old_ms, comp.added_p50_ratio,
             comp.added_p50_round_ratios),
        ):  # fmt: skip
            aside = "" if conns == VERDICT_CONNECTIONS else "; for information"
            name = f"gateway {what} vs {report.baseline.name}, {conns} conn ({comp.load}{aside})"
            rounds = " / ".join(_ratio_x(r) for r in per_round)
            out.append(
                Verdict(
                    name,
                    f"<= {MAX_BASELINE_RATIO:g}x baseline",
                    f"{_ratio_x(times)} ({ms(new, 3)} vs {ms(old, 3)} ms; per round {rounds})",
                    None if math.isnan(times) else times <= MAX_BASELINE_RATIO,
                )
            )
            finite = [r for r in per_round if not math.isnan(r)]
            if finite and min(finite) <= MAX_BASELINE_RATIO < max(finite):
                notes.append(
                    f"{name}: the rounds disagree about the {MAX_BASELINE_RATIO:g}x margin "
                    f"(per round {rounds}): that verdict is within this run's noise; more "
                    "rounds or longer cells narrow it"
                )
    return out, notes


def summarize(
    raw: Raw,
    names: list[str],
    opts: Options,
    notes: list[str],
    command: str,
    sources: dict[str, str] | None = None,
    baseline: Baseline | None = None,
) -> Report:
    wrk_small = wrk_sse = None
    if raw.wrk:
        wrk_small = {n: WrkStat.of(raw.wrk[("wrk-small", n)], None) for n in names}
        wrk_sse = {n: WrkStat.of(raw.wrk[("wrk-sse", n)], raw.events[n]) for n in names}
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    settings.update(profile=PROFILE, stream_tokens=STREAM_TOKENS, sse_tokens=SSE_TOKENS)
    report = Report(
        command=command,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        nproc=os.cpu_count() or 0,
        machine=f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        settings=settings,
        targets=names,
        notes=notes,
        latency=_latency_cells(raw, "latency", opts.latency_connections, names, opts),
        ttft=_latency_cells(raw, "ttft", opts.stream_connections, names, opts),
        wrk_small=wrk_small,
        wrk_sse=wrk_sse,
        verdicts=[],
        sources=sources or {},
        baseline=baseline,
    )
    report.verdicts = verdicts(report)
    if baseline is not None:
        report.vs_baseline = [Comparison.of(c, "gateway", baseline.name) for c in report.latency]
        report.baseline_verdicts, noise = baseline_verdicts(report)
        report.notes += noise
    report.notes += bound_notes(report)
    return report


def failure_notes(raw: Raw, targets: Sequence[Target]) -> list[str]:
    """Where a gateway failed requests, say where and what its log said last: a benchmark of
    another commit's code must show why that code failed, not only that it did."""
    notes = []
    for t in targets:
        failed = [
            f"{sum(s.errors for s in rounds)} in {part} c={c}"
            for (part, c, name), rounds in raw.samples.items()
            if name == t.name and any(s.errors for s in rounds)
        ]
        if not failed or t.log is None or not t.log.exists():
            continue
        lines = [
            line[:240]
            for line in t.log.read_text(errors="replace").splitlines()
            if " WARNING " in line or " ERROR " in line
        ]
        last = "; its last warnings: " + " | ".join(lines[-3:]) if lines else ""
        notes.append(f"{t.name} failed requests ({', '.join(failed)}){last}")
    return notes


def bound_notes(report: Report) -> list[str]:
    """Say so when the simulator itself, called directly, cannot reach a throughput target: no
    proxy in front of it can then show the target on this machine."""
    notes = []
    for label, stats, target, unit in (
        ("requests/s", report.wrk_small, MIN_REQUESTS_PER_S, "req/s"),
        ("SSE chunks/s", report.wrk_sse, MIN_CHUNKS_PER_S, "chunks/s"),
    ):
        if not stats:
            continue
        direct, gw = stats["direct"], stats.get("gateway")
        value = direct.chunks_per_s if direct.chunks_per_s is not None else direct.requests_per_s
        if value < target:
            note = (
                f"{label}: the simulator alone (direct) serves {value:,.0f} {unit} here, below "
                f"the {target:,.0f} target, using {direct.server_cpu_cores:.2f} cores; the "
                "proxies' figures are bounded by it and by the shared CPUs"
            )
            if gw is not None and gw.server_cpu_cores > 0:
                # An extrapolation, labelled as one: the verdict stays on the measured figure.
                per_core = (gw.chunks_per_s or gw.requests_per_s) / gw.server_cpu_cores
                note += (
                    f" (the gateway used {gw.server_cpu_cores:.2f} cores for its figure: "
                    f"{per_core:,.0f} {unit} per gateway CPU-second)"
                )
            notes.append(note)
    return notes




def run(opts: Options, console: Console | None = None) -> Report:
    """Start the targets, measure, stop them; print the tables and write JSON, markdown, PNG."""
    console = console or Console()
    command = opts.command or shlex.join(["tiergate", *sys.argv[1:]])
    notes: list[str] = []
    model = load_profile(PROFILE).model
    wrk_bin = shutil.which("wrk")
    if opts.wrk_seconds <= 0:
        notes.append("wrk part skipped: --wrk-seconds 0")
    elif wrk_bin is None:
        notes.append("wrk part skipped: wrk is not installed (e.g. apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="tiergate-overhead-") as tmp:
        workdir = Path(tmp)
        wrk: tuple[str, Path, Path] | None = None
        if wrk_bin is not None and opts.wrk_seconds > 0:
            small_lua, sse_lua = workdir / "post.lua", workdir / "post-sse.lua"
            small_lua.write_text(wrk_script(small_body(model)))
            sse_lua.write_text(wrk_script(stream_body(model, SSE_TOKENS, usage=False)))
            wrk = (wrk_bin, small_lua, sse_lua)
        with contextlib.ExitStack() as stack:
            baseline: Baseline | None = None
            with console.status("starting the simulator, nginx and the gateways..."):
                if opts.baseline is not None:
                    baseline = stack.enter_context(checkout(opts.baseline, workdir))
                    if baseline.sha == git("rev-parse", "HEAD"):
                        notes.append(
                            f"the baseline {baseline.name} is HEAD: unless the working tree "
                            "changed the gateway, both gateways run the same code and their "
                            "difference is this run's noise"
                        )
                targets = stack.enter_context(
                    running_targets(workdir, model, notes, opts.use_nginx, baseline)
                )
            for note in notes:
                console.print(f"[yellow]note:[/] {note}")
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            progress = stack.enter_context(Progress(*columns, console=console, transient=True))
            runner = stack.enter_context(event_loop_runner())
            raw = runner.run(measure(targets, opts, model, wrk, progress))
        notes += failure_notes(raw, targets)  # the logs are still there, the processes done
    sources = {t.name: t.source for t in targets if t.source is not None}
    report = summarize(raw, [t.name for t in targets], opts, notes, command, sources, baseline)
    print_report(report, console)
    write_outputs(report, opts, console)
    return report


# --- output ---------------------------------------------------------------------------------


def _x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}x"


def _signed(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:+.3f}"


def latency_rows(cells: list[LatencyCell], with_rate: bool) -> tuple[list[str], list[list[str]]]:
    head = ["conns", "load", "target", "n", "errors"]
    head += ["req/s"] if with_rate else []
    head += ["p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "p50 ratio", "p99 ratio"]
    head += ["CPU ms/request", "CPU ms/request per round"]
    rows = []
    for cell in cells:
        for name, s in cell.stats.items():
            a = cell.added.get(name)
            row = [str(cell.concurrency), cell.load, name, str(s.n), str(s.errors)]
            row += [f"{s.achieved_rps:,.0f}"] if with_rate else []
            row += [ms(s.p50_ms, 3), ms(s.p99_ms, 3)]
            row += (
                [_signed(a.p50_ms), _signed(a.p99_ms), _x(a.p50_ratio), _x(a.p99_ratio)]
                if a
                else ["", "", "", ""]
            )
            cpu = cell.cpu[name]
            row += [ms(cpu.ms_per_request, 3), _per_round(cpu.rounds)]
            rows.append(row)
    return head, rows


def _ms3(v: float) -> str:
    return ms(v, 3)


def _per_round(values: Sequence[float], fmt: Callable[[float], str] | None = None) -> str:
    return " / ".join((fmt or _ms3)(v) for v in values)


def baseline_rows(report: Report, what: Literal["added p50", "cpu"]) -> list[list[str]]:
    rows = []
    for c in report.vs_baseline:
        if what == "cpu":
            figures = (c.cpu_new_ms, c.cpu_old_ms, c.cpu_ratio)
            rounds = (c.cpu_rounds_new, c.cpu_rounds_old, c.cpu_round_ratios)
        else:
            figures = (c.added_p50_new_ms, c.added_p50_old_ms, c.added_p50_ratio)
            rounds = (c.added_p50_rounds_new, c.added_p50_rounds_old, c.added_p50_round_ratios)
        rows.append([
            str(c.concurrency), c.load, f"{c.n_new} / {c.n_old}",
            f"{c.errors_new} / {c.errors_old}", ms(figures[0], 3), ms(figures[1], 3),
            _ratio_x(figures[2]), _per_round(rounds[0]), _per_round(rounds[1]),
            _per_round(rounds[2], _ratio_x),
        ])  # fmt: skip
    return rows


def baseline_sections(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    if report.baseline is None:
        return []
    old = report.baseline.name
    head = ["conns", "load", "n new / old", "errors new / old", "gateway", old, "new/old",
            "gateway per round", f"{old} per round", "new/old per round"]  # fmt: skip
    return [
        (f"Gateway vs baseline {old}: added p50 ms, small requests (pooled p50 - direct's)",
         head, baseline_rows(report, "added p50")),
        (f"Gateway vs baseline {old}: CPU ms/request, small requests (median of rounds)",
         head, baseline_rows(report, "cpu")),
        (f"Gateway vs baseline {old}: verdicts", ["criterion", "target", "measured", "verdict"],
         [[v.name, v.target, v.measured, v.word] for v in report.baseline_verdicts]),
    ]  # fmt: skip


def wrk_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["test", "target", "requests", "errors", "req/s (mean)", "req/s per round",
            "server CPU cores", "req/s per server core", "events/response", "chunks/s",
            "vs direct"]  # fmt: skip
    rows = []
    for test, stats in (("small", report.wrk_small), ("SSE 64 tokens", report.wrk_sse)):
        if not stats:
            continue
        direct = stats["direct"].requests_per_s
        for name, w in stats.items():
            rows.append([
                test, name, f"{w.requests:,}", str(w.errors), f"{w.requests_per_s:,.0f}",
                " / ".join(f"{v:,.0f}" for v in w.rounds), f"{w.server_cpu_cores:.2f}",
                f"{ratio(w.requests_per_s, w.server_cpu_cores):,.0f}",
                "" if w.events_per_response is None else str(w.events_per_response),
                "" if w.chunks_per_s is None else f"{w.chunks_per_s:,.0f}",
                "" if name == "direct" else _x(ratio(w.requests_per_s, direct)),
            ])  # fmt: skip
    return head, rows


def verdict_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["criterion", "target", "measured", "verdict"]
    return head, [[v.name, v.target, v.measured, v.word] for v in report.verdicts]


def sections(report: Report) -> list[tuple[str, list[str], list[list[str]]]]:
    out = [
        ("Added latency, small non-streamed requests", *latency_rows(report.latency, True)),
        ("Added TTFT, streams of 32 tokens", *latency_rows(report.ttft, False)),
    ]
    if report.wrk_small:
        out.append(("Throughput with wrk (one gateway worker)", *wrk_rows(report)))
    out.append(("Verdicts", *verdict_rows(report)))
    return out + baseline_sections(report)


def print_report(report: Report, console: Console) -> None:
    styles = {"MET": "bold green", "NOT MET": "bold red", "NOT MEASURED": "bold yellow"}
    for title, head, rows in sections(report):
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="left" if h in ("load", "target", "test") else "right")
        for row in rows:
            style = styles.get(row[-1]) if title.endswith("erdicts") else None
            table.add_row(*row, style=style)
        console.print(table)
    for v in [*report.verdicts, *report.baseline_verdicts]:
        console.print(f"[{styles[v.word]}]{v.word}[/]: {v.name} = {v.measured} (target {v.target})")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")














def markdown(report: Report, chart: Path | None) -> str:
    s = report.settings
    parts = [
        "# Gateway overhead",
        "",
        f"- Command: `{report.command}`",
        f"- Date: {report.date}",
        f"- Machine: `nproc` = {report.nproc} ({report.machine})",
        f"- Targets: {', '.join(report.targets)}, all in front of one `{PROFILE}` simulator "
        "(no model time) on loopback; the gateway is `tiergate serve` with one worker.",
        f"- Rounds: {s['rounds']}, {s['duration_s']:g} s per target per round for each latency "
        f"and TTFT cell, targets in rotating order; wrk {s['wrk_seconds']} s per target per "
        f"round (`wrk -t{s['wrk_threads']} -c{s['wrk_connections']}`).",
        "- Latency at 1 connection is a closed loop; at more connections an open loop at a fixed "
        "aggregate rate, each latency timed from its scheduled start. Added = proxy's percentile "
        "minus direct's; ratio = proxy's / direct's.",
        "- The client, the simulator and the proxy share this machine's CPUs: every figure "
        "includes the client's cost, equally for every target.",
        "- wrk's server CPU is that of the process wrk talks to: the simulator (direct), the "
        "nginx worker (nginx), the gateway (gateway); the simulator works behind every target.",
        "- CPU ms/request: the CPU time (user + system, /proc, in ticks of "
        f"{1000 / os.sysconf('SC_CLK_TCK'):g} ms) the serving process used over a cell's timed "
        "window (warm-up excluded) divided by the requests it completed in that window: the "
        "simulator (direct), the nginx worker (nginx), each gateway's own process (its "
        "background work in that window, such as scraping the simulator, included); shown as "
        "the median over rounds, then each round's value.",
    ]
    for name in report.sources:
        how = "the working tree's code (this interpreter, the repository as its cwd)"
        if report.baseline is not None and name == report.baseline.name:
            b = report.baseline
            how = (
                f"`git archive {b.sha}` (ref `{b.ref}`) extracted into a temporary folder, run "
                f"as `python -m {b.module} serve` with cwd and PYTHONPATH set to that folder"
            )
        parts.append(f"- `{name}` ran {how}; checked by importing `gateway` the same way "
                     "before the start.")  # fmt: skip
    if report.baseline is not None:
        parts.append(
            f"- Against the baseline: the criterion is the gateway's CPU/request and added p50 "
            f"at {VERDICT_CONNECTIONS} connections no worse than {MAX_BASELINE_RATIO:g}x "
            f"`{report.baseline.name}`'s, both measured in this run, in the same rounds, in "
            "rotating order; the per-round columns show how far rounds disagree."
        )
    drawn = None if chart is None else (chart, "p50/p99 per target and concurrency")
    return finish_markdown(parts, report.notes, sections(report), drawn)


def chart(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    colors = {"direct": "tab:blue", "nginx": "tab:green", "gateway": "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, cells, title in (
        (axes[0], report.latency, "small requests: latency"),
        (axes[1], report.ttft, "streams: TTFT"),
    ):
        width = 0.8 / len(report.targets)
        for i, name in enumerate(report.targets):
            xs = [j + (i - (len(report.targets) - 1) / 2) * width for j in range(len(cells))]
            p99 = [c.stats[name].p99_ms for c in cells]
            p50 = [c.stats[name].p50_ms for c in cells]
            # p99 drawn pale behind the p50 bar of the same target.
            color = colors.get(name, "tab:red")  # the baseline's gateway
            ax.bar(xs, p99, width, color=color, alpha=0.35, label=f"{name} p99")
            ax.bar(xs, p50, width * 0.6, color=color, label=f"{name} p50")
        ax.set_xticks(range(len(cells)), [f"{c.concurrency} conn" for c in cells])
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_ylabel("ms (log scale)")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, ncols=2)
    fig.suptitle(f"tiergate overhead ({report.date}, nproc={report.nproc})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)










def write_outputs(report: Report, opts: Options, console: Console) -> None:
    save(report, opts, console, chart, markdown)


# -- the command ------------------------------------------------------------------------------


def command(
    duration: Annotated[
        float, typer.Option(help="Seconds per target per round, for each latency/TTFT cell.")
    ] = 3.0,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (targets in rotating order).")] = 3,
    rate: Annotated[
        float, typer.Option(min=1, help="Aggregate req/s of the paced load at 64/256 conns.")
    ] = 400.0,
    wrk_seconds: Annotated[
        int, typer.Option(min=0, help="wrk run length per target per round (0 skips wrk).")
    ] = 5,
    out: Annotated[
        Path, typer.Option(help="JSON results; the .md and .png are written next to it.")
    ] = Path("docs/results/overhead.json"),
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="REF",
            help="Git ref (commit, tag, HEAD~3) whose gateway runs side by side with the working "
            "tree's, as target gateway@<sha>; adds a gateway-vs-baseline section (CPU/request and "
            "added p50, criterion: no worse than 5% above).",
        ),
    ] = None,
) -> None:
    """The gateway's own cost: added latency, added TTFT and throughput of one gateway worker,
    against the same instant simulator called directly and through nginx (the floor), and
    optionally against the gateway of another commit."""

    setup_logging("warning")
    run(Options(duration_s=duration, rounds=rounds, rate=rate, wrk_seconds=wrk_seconds, out=out,
                baseline=baseline))  # fmt: skip
