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
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiohttp
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

from engines.sim.launch import GatewayProcess, SimProcess, cpu_seconds
from engines.sim.profile import load_profile
from loadtests.client import Result, stream_completion
from loadtests.nginx import NginxProcess, nginx_binary
from loadtests.summarize import percentile

PROFILE = "instant"
TARGETS = ("direct", "nginx", "gateway")
PROXIES = ("nginx", "gateway")
JSON_HEADERS = {"Content-Type": "application/json"}
STREAM_TOKENS = 32
SSE_TOKENS = 64

# The targets the verdict is judged against (per gateway worker).
MAX_ADDED_P50_MS = 1.0
MAX_ADDED_P99_MS = 5.0
VERDICT_CONNECTIONS = 64
MIN_REQUESTS_PER_S = 1500.0
MIN_CHUNKS_PER_S = 20000.0

Part = Literal["latency", "ttft", "wrk-small", "wrk-sse"]


@dataclass(frozen=True)
class Options:
    duration_s: float = 3.0  # per target per round, for each latency and TTFT cell
    rounds: int = 3
    rate: float = 400.0  # aggregate req/s of the paced load
    wrk_seconds: int = 5  # 0 skips the wrk part
    out: Path = Path("docs/results/overhead.json")
    latency_connections: tuple[int, ...] = (1, 64, 256)
    stream_connections: tuple[int, ...] = (1, 64)
    wrk_connections: int = 64
    wrk_threads: int = 2
    use_nginx: bool = True
    chart: bool = True
    command: str | None = None  # as shown in the markdown; default: this process's argv

    @property
    def markdown_path(self) -> Path:
        return self.out.with_suffix(".md")

    @property
    def chart_path(self) -> Path:
        return self.out.with_suffix(".png")


# --- statistics ---------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


@dataclass
class Samples:
    """Latencies (seconds) of one measurement on one target, pooled over rounds."""

    values: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0  # time from the first scheduled start to the last answer, summed

    def add(self, ok: bool, latency: float) -> None:
        if ok:
            self.values.append(latency)
        else:
            self.errors += 1


@dataclass(frozen=True)
class Stat:
    n: int
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    achieved_rps: float

    @classmethod
    def of(cls, s: Samples) -> Stat:
        ms = [v * 1000 for v in s.values]
        return cls(
            n=len(ms),
            errors=s.errors,
            p50_ms=percentile(ms, 50),
            p99_ms=percentile(ms, 99),
            mean_ms=sum(ms) / len(ms) if ms else math.nan,
            achieved_rps=(len(ms) + s.errors) / s.wall_s if s.wall_s > 0 else math.nan,
        )


@dataclass(frozen=True)
class Added:
    """A proxy's percentiles minus direct's (ms), and divided by them."""

    p50_ms: float
    p99_ms: float
    p50_ratio: float
    p99_ratio: float

    @classmethod
    def of(cls, proxy: Stat, direct: Stat) -> Added:
        return cls(
            p50_ms=proxy.p50_ms - direct.p50_ms,
            p99_ms=proxy.p99_ms - direct.p99_ms,
            p50_ratio=_ratio(proxy.p50_ms, direct.p50_ms),
            p99_ratio=_ratio(proxy.p99_ms, direct.p99_ms),
        )


@dataclass(frozen=True)
class LatencyCell:
    concurrency: int
    load: str  # "closed loop" or "open loop, N req/s"
    stats: dict[str, Stat]
    added: dict[str, Added]


@dataclass(frozen=True)
class WrkRun:
    requests_per_s: float
    requests: int
    errors: int  # non-2xx answers plus socket errors
    server_cpu_cores: float  # CPU of the process wrk talks to (nginx: its worker)


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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdicts"] = [{**asdict(v), "result": v.word} for v in self.verdicts]
        clean: dict[str, Any] = _finite(data)
        return clean


def _finite(x: Any) -> Any:
    """NaN is not JSON: write null instead."""
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


# --- targets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    server_pids: Callable[[], list[int]]  # where the serving happens, for CPU accounting


def gateway_config(sim_url: str, model: str) -> dict[str, Any]:
    return {
        "tiers": [
            {
                "name": "pool",
                "role": "throughput",
                "backends": [{"url": sim_url, "models": [model]}],
            }
        ],
        "log_level": "warning",
    }


@contextlib.contextmanager
def running_targets(
    workdir: Path, model: str, notes: list[str], use_nginx: bool = True
) -> Iterator[list[Target]]:
    """Start the simulator, nginx in front of it (when installed) and the gateway; stop them all
    on the way out, whatever happens (Ctrl-C included)."""
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
        gw = stack.enter_context(GatewayProcess(config=config, log=workdir / "gateway.log"))
        targets.append(Target("gateway", gw.url, lambda: [gw.pid]))
        yield targets


# --- load generators ------------------------------------------------------------------------


def small_body(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "hello", "max_tokens": 4, "ignore_eos": True}


def stream_body(model: str, tokens: int, usage: bool) -> dict[str, Any]:
    body: dict[str, Any] = {**small_body(model), "max_tokens": tokens, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


def _session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=60, sock_connect=5),
    )


async def post_ok(session: aiohttp.ClientSession, url: str, payload: bytes) -> bool:
    try:
        async with session.post(url, data=payload, headers=JSON_HEADERS) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def _warm(session: aiohttp.ClientSession, url: str, payload: bytes, n: int) -> None:
    """Open the pool's connections before timing: connection setup is not the per-request cost
    a keep-alive client pays."""
    await asyncio.gather(*(post_ok(session, url, payload) for _ in range(n)))


async def closed_small(url: str, payload: bytes, connections: int, duration_s: float) -> Samples:
    """`connections` users, each sending its next request as soon as the last one answered."""
    out = Samples()
    async with _session(connections) as session:
        await _warm(session, url, payload, connections)
        start = time.perf_counter()
        deadline = start + duration_s

        async def user() -> None:
            while (t0 := time.perf_counter()) < deadline:
                ok = await post_ok(session, url, payload)
                out.add(ok, time.perf_counter() - t0)

        await asyncio.gather(*(user() for _ in range(connections)))
        out.wall_s = time.perf_counter() - start
    return out


async def paced_small(
    url: str, payload: bytes, connections: int, rate: float, duration_s: float
) -> Samples:
    """Open loop: `rate` requests/s in all, connection c sending at c/rate + k*connections/rate.
    Each latency is measured from the scheduled start, so a request that starts late because the
    previous one on its connection (or the client) was slow is charged for the wait."""
    out = Samples()
    period = connections / rate
    async with _session(connections) as session:
        await _warm(session, url, payload, connections)
        start = time.perf_counter() + 0.005
        ends: list[float] = [start]

        async def pacer(c: int) -> None:
            due = start + c / rate
            while due < start + duration_s:
                if (delay := due - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                ok = await post_ok(session, url, payload)
                end = time.perf_counter()
                out.add(ok, end - due)
                ends.append(end)
                due += period

        await asyncio.gather(*(pacer(c) for c in range(connections)))
        out.wall_s = max(ends) - start
    return out


async def closed_ttft(
    url: str, body: dict[str, Any], connections: int, duration_s: float
) -> Samples:
    """`connections` streaming users in a closed loop; a sample is one stream's TTFT."""
    out = Samples()
    async with _session(connections) as session:
        await asyncio.gather(
            *(stream_completion(session, url, body, Result(u, 0, time.perf_counter()))
              for u in range(connections))
        )  # fmt: skip
        start = time.perf_counter()
        deadline = start + duration_s

        async def user(u: int) -> None:
            i = 0
            while time.perf_counter() < deadline:
                i += 1
                r = await stream_completion(session, url, body, Result(u, i, time.perf_counter()))
                out.add(r.ok and r.ttft is not None, r.ttft or 0.0)

        await asyncio.gather(*(user(u) for u in range(connections)))
        out.wall_s = time.perf_counter() - start
    return out


async def count_events(url: str, body: dict[str, Any]) -> int:
    """The `data:` events of one streamed response (text chunks, finish, `[DONE]`)."""
    async with _session(1) as session, session.post(url, json=body) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}: {text[:200]}")
    return sum(1 for line in text.splitlines() if line.startswith("data:"))


# --- wrk ------------------------------------------------------------------------------------


def wrk_script(body: dict[str, Any]) -> str:
    # A Lua long string needs no escaping of the JSON inside it.
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = [==[{json.dumps(body)}]==]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )


def parse_wrk(output: str) -> tuple[float, int, int]:
    """(requests/s, requests, errors) from wrk's report; errors = non-2xx + socket errors."""
    rps = re.search(r"Requests/sec:\s*([\d.]+)", output)
    if rps is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{output}")
    total = re.search(r"(\d+) requests in", output)
    errors = 0
    if m := re.search(r"Non-2xx or 3xx responses:\s*(\d+)", output):
        errors += int(m.group(1))
    if m := re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    ):
        errors += sum(int(g) for g in m.groups())
    return float(rps.group(1)), int(total.group(1)) if total else 0, errors


def _cpu(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


async def run_wrk(
    binary: str, target: Target, script: Path, seconds: int, connections: int, threads: int
) -> WrkRun:
    pids = target.server_pids()
    cmd = [binary, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "-s", str(script),
           target.url + "/v1/completions"]  # fmt: skip
    c0, t0 = _cpu(pids), time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        stdout, _ = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled (Ctrl-C): do not leave wrk running
            proc.kill()
            await proc.wait()
    cores = (_cpu(pids) - c0) / (time.perf_counter() - t0)
    output = stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}:\n{output}")
    rps, requests, errors = parse_wrk(output)
    return WrkRun(rps, requests, errors, cores)


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


def rotation(names: Sequence[str], r: int) -> list[str]:
    """Round r's order: the list rotated by r, so every target takes every slot in turn."""
    k = r % len(names)
    return [*names[k:], *names[:k]]


@dataclass
class Raw:
    """Everything measured, before it is summarized."""

    samples: dict[tuple[Part, int, str], Samples] = field(default_factory=dict)
    wrk: dict[tuple[Part, str], list[WrkRun]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)

    def sample(self, part: Part, concurrency: int, target: str) -> Samples:
        return self.samples.setdefault((part, concurrency, target), Samples())


async def _measure(
    targets: list[Target],
    opts: Options,
    model: str,
    wrk: tuple[str, Path, Path] | None,
    progress: Progress,
) -> Raw:
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
                if cell.part == "latency":
                    s = (
                        await closed_small(url, small, c, opts.duration_s)
                        if c == 1
                        else await paced_small(url, small, c, opts.rate, opts.duration_s)
                    )
                elif cell.part == "ttft":
                    s = await closed_ttft(url, ttft_body, c, opts.duration_s)
                else:
                    assert wrk is not None
                    binary, small_lua, sse_lua = wrk
                    script = small_lua if cell.part == "wrk-small" else sse_lua
                    run = await run_wrk(
                        binary, target, script, opts.wrk_seconds, c, opts.wrk_threads
                    )
                    raw.wrk.setdefault((cell.part, name), []).append(run)
                    progress.advance(task)
                    continue
                pooled = raw.sample(cell.part, c, name)
                pooled.values += s.values
                pooled.errors += s.errors
                pooled.wall_s += s.wall_s
                progress.advance(task)
    return raw


def _latency_cells(
    raw: Raw, part: Part, conns: Sequence[int], names: list[str], opts: Options
) -> list[LatencyCell]:
    cells = []
    for c in conns:
        stats = {n: Stat.of(raw.sample(part, c, n)) for n in names}
        added = {n: Added.of(stats[n], stats["direct"]) for n in names if n in PROXIES}
        closed = part == "ttft" or c == 1
        load = "closed loop" if closed else f"open loop, {opts.rate:g} req/s"
        cells.append(LatencyCell(c, load, stats, added))
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


def summarize(raw: Raw, names: list[str], opts: Options, notes: list[str], command: str) -> Report:
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
    )
    report.verdicts = verdicts(report)
    report.notes += bound_notes(report)
    return report


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


def event_loop_runner() -> asyncio.Runner:
    # The gateway and the simulator run on uvloop; so does the client when it can, so that the
    # client's share of the (shared) CPU stays as small as possible.
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


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
            with console.status("starting the simulator, nginx and the gateway..."):
                targets = stack.enter_context(
                    running_targets(workdir, model, notes, opts.use_nginx)
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
            raw = runner.run(_measure(targets, opts, model, wrk, progress))
    report = summarize(raw, [t.name for t in targets], opts, notes, command)
    print_report(report, console)
    write_outputs(report, opts, console)
    return report


# --- output ---------------------------------------------------------------------------------


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.3f}"


def _x(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}x"


def _signed(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:+.3f}"


def latency_rows(cells: list[LatencyCell], with_rate: bool) -> tuple[list[str], list[list[str]]]:
    head = ["conns", "load", "target", "n", "errors"]
    head += ["req/s"] if with_rate else []
    head += ["p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "p50 ratio", "p99 ratio"]
    rows = []
    for cell in cells:
        for name, s in cell.stats.items():
            a = cell.added.get(name)
            row = [str(cell.concurrency), cell.load, name, str(s.n), str(s.errors)]
            row += [f"{s.achieved_rps:,.0f}"] if with_rate else []
            row += [_ms(s.p50_ms), _ms(s.p99_ms)]
            row += (
                [_signed(a.p50_ms), _signed(a.p99_ms), _x(a.p50_ratio), _x(a.p99_ratio)]
                if a
                else ["", "", "", ""]
            )
            rows.append(row)
    return head, rows


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
                f"{_ratio(w.requests_per_s, w.server_cpu_cores):,.0f}",
                "" if w.events_per_response is None else str(w.events_per_response),
                "" if w.chunks_per_s is None else f"{w.chunks_per_s:,.0f}",
                "" if name == "direct" else _x(_ratio(w.requests_per_s, direct)),
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
    return out


def print_report(report: Report, console: Console) -> None:
    styles = {"MET": "bold green", "NOT MET": "bold red", "NOT MEASURED": "bold yellow"}
    for title, head, rows in sections(report):
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="left" if h in ("load", "target", "test") else "right")
        for row in rows:
            style = styles.get(row[-1]) if title == "Verdicts" else None
            table.add_row(*row, style=style)
        console.print(table)
    for v in report.verdicts:
        console.print(f"[{styles[v.word]}]{v.word}[/]: {v.name} = {v.measured} (target {v.target})")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


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
    ]
    parts += [f"- Note: {n}" for n in report.notes]
    for title, head, rows in sections(report):
        parts += ["", f"## {title}", "", markdown_table(head, rows)]
    if chart is not None:
        parts += ["", f"![p50/p99 per target and concurrency]({chart.name})"]
    return "\n".join(parts) + "\n"


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
            ax.bar(xs, p99, width, color=colors.get(name), alpha=0.35, label=f"{name} p99")
            ax.bar(xs, p50, width * 0.6, color=colors.get(name), label=f"{name} p50")
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
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    png: Path | None = None
    if opts.chart:
        try:
            chart(report, opts.chart_path)
            png = opts.chart_path
        except ImportError:
            report.notes.append("chart skipped: matplotlib is not installed (extra `load`)")
    opts.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    opts.markdown_path.write_text(markdown(report, png))
    written = [opts.out, opts.markdown_path, *([png] if png else [])]
    console.print("wrote " + ", ".join(str(p) for p in written))
