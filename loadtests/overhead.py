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
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

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

from engines.sim.profile import load_profile
from loadtests.client import Result, stream_completion
from loadtests.nginx import NginxProcess, nginx_binary
from loadtests.procs import GatewayProcess, SimProcess, cpu_seconds
from loadtests.summarize import json_safe, percentile

PROFILE = "instant"
TARGETS = ("direct", "nginx", "gateway")
PROXIES = ("nginx", "gateway")  # plus the baseline's gateway, `gateway@<sha>`, when there is one
JSON_HEADERS = {"Content-Type": "application/json"}
STREAM_TOKENS = 32
SSE_TOKENS = 64

# The targets the verdict is judged against (per gateway worker).
MAX_ADDED_P50_MS = 1.0
MAX_ADDED_P99_MS = 5.0
VERDICT_CONNECTIONS = 64
MIN_REQUESTS_PER_S = 1500.0
MIN_CHUNKS_PER_S = 20000.0
# Against a baseline commit: no worse than 5% above it.
MAX_BASELINE_RATIO = 1.05

# The repository whose commits a baseline ref names.
REPO = Path(__file__).resolve().parents[1]

Part = Literal["latency", "ttft", "wrk-small", "wrk-sse"]


class OutputPaths:
    """A bench's report files: its JSON (`out`), and its markdown and chart beside it."""

    out: Path

    @property
    def markdown_path(self) -> Path:
        return self.out.with_suffix(".md")

    @property
    def chart_path(self) -> Path:
        return self.out.with_suffix(".png")


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


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def is_proxy(name: str) -> bool:
    return name in PROXIES or name.startswith("gateway@")


def _cpu(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


@dataclass
class Samples:
    """Latencies (seconds) of one measurement on one target (one round, or pooled over rounds)."""

    values: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0  # time from the first scheduled start to the last answer, summed
    cpu_s: float = 0.0  # CPU the serving process(es) used over the same window

    def add(self, ok: bool, latency: float) -> None:
        if ok:
            self.values.append(latency)
        else:
            self.errors += 1

    @property
    def completed(self) -> int:
        """Requests answered in the window, errors included: they cost CPU too."""
        return len(self.values) + self.errors

    @classmethod
    def pool(cls, rounds: Sequence[Samples]) -> Samples:
        out = cls()
        for s in rounds:
            out.values += s.values
            out.errors += s.errors
            out.wall_s += s.wall_s
            out.cpu_s += s.cpu_s
        return out


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
class Cpu:
    """CPU of the serving process per completed request (ms): per round, and their median (the
    rounds run at different moments of a shared machine: the median resists one bad round)."""

    ms_per_request: float
    rounds: list[float]
    cpu_s: float  # summed over rounds
    requests: int  # completed, summed over rounds

    @classmethod
    def of(cls, rounds: Sequence[Samples]) -> Cpu:
        per = [_ratio(1000 * s.cpu_s, s.completed) for s in rounds]
        return cls(
            ms_per_request=_median(per),
            rounds=per,
            cpu_s=sum(s.cpu_s for s in rounds),
            requests=sum(s.completed for s in rounds),
        )


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
class Baseline:
    """A commit's code extracted into a folder, and how its gateway is started from there."""

    ref: str
    sha: str
    short: str
    folder: str
    module: (
        str  # `python -m MODULE serve ...`: `tiergate`, or `gateway.serve.cli` before it existed
    )

    @property
    def name(self) -> str:
        return f"gateway@{self.short}"


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
            return [_ratio(x, y) for x, y in zip(a, b, strict=True)]

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
            added_p50_ratio=_ratio(cell.added[new].p50_ms, cell.added[old].p50_ms),
            added_p50_rounds_new=a_new,
            added_p50_rounds_old=a_old,
            added_p50_round_ratios=ratios(a_new, a_old),
            cpu_new_ms=c_new.ms_per_request,
            cpu_old_ms=c_old.ms_per_request,
            cpu_ratio=_ratio(c_new.ms_per_request, c_old.ms_per_request),
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


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    server_pids: Callable[[], list[int]]  # where the serving happens, for CPU accounting
    source: str | None = None  # gateways: the folder their code was imported from
    log: Path | None = None  # gateways: what they logged, quoted when requests failed


def _git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {shlex.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


@contextlib.contextmanager
def checkout(ref: str, into: Path) -> Iterator[Baseline]:
    """`ref`'s files (git archive: the repository and its worktrees are left untouched) in a
    folder under `into`, removed on the way out whatever happens."""
    sha = _git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")
    short = _git("rev-parse", "--short", sha)
    root = (into / f"baseline-{short}").resolve()
    root.mkdir()
    try:
        tar = into / f"baseline-{short}.tar"
        _git("archive", "--format=tar", f"--output={tar}", sha)
        untar = subprocess.run(
            ["tar", "-x", "-f", str(tar), "-C", str(root)], capture_output=True, text=True
        )
        tar.unlink()
        if untar.returncode != 0:
            raise RuntimeError(f"extracting {ref} ({short}) failed: {untar.stderr.strip()}")
        # The entry point of the day: the composed `tiergate` package, else the gateway's own CLI
        # (the layout before the package existed).
        module = "tiergate" if (root / "tiergate" / "__main__.py").exists() else "gateway.serve.cli"
        yield Baseline(ref=ref, sha=sha, short=short, folder=str(root), module=module)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def import_origins(
    modules: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> dict[str, Path]:
    """Where this interpreter imports `modules` from, run with the given cwd and environment
    (which is how a launcher will run it): the proof of which code a gateway target runs."""
    code = "import importlib as i, sys\nfor m in sys.argv[1:]: print(i.import_module(m).__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"importing {', '.join(modules)} failed:\n{proc.stderr[-2000:]}")
    return {m: Path(line) for m, line in zip(modules, proc.stdout.splitlines(), strict=True)}


def _code_folder(origins: dict[str, Path]) -> Path:
    """The folder the packages were imported from (`<folder>/gateway/__init__.py`)."""
    folders = {o.resolve().parents[1] for o in origins.values()}
    if len(folders) != 1:
        raise RuntimeError(f"packages imported from several folders: {origins}")
    return folders.pop()


@dataclass
class BaselineGatewayProcess(GatewayProcess):
    """`serve` of the baseline's code: cwd and PYTHONPATH are its folder, so that every import
    (gateway, engines, ...) resolves there before the working tree's editable install."""

    root: Path | None = None
    module: str = "gateway.serve.cli"

    def command(self) -> list[str]:
        assert self.root is not None
        # `env -C` sets the cwd (which `python -m` puts first on sys.path): the launcher itself
        # starts every process in this one's cwd. exec keeps the pid, which the CPU is read from.
        return ["env", "-C", str(self.root), sys.executable, "-m", self.module, *self.argv()]


@contextlib.contextmanager
def baseline_gateway(baseline: Baseline, config: Path, log: Path) -> Iterator[Target]:
    root = Path(baseline.folder)
    env = {"PYTHONPATH": str(root)}
    entry = baseline.module.split(".")[0]
    origins = import_origins(sorted({"gateway", entry}), cwd=root, env=env)
    if (folder := _code_folder(origins)) != root:
        raise RuntimeError(f"{baseline.name} would import its code from {folder}, not {root}")
    with BaselineGatewayProcess(
        config=config, log=log, env=env, root=root, module=baseline.module
    ) as gw:
        # The process that serves, not only the probe, runs from the extracted folder.
        cwd = Path(os.readlink(f"/proc/{gw.pid}/cwd"))
        if cwd != root:
            raise RuntimeError(f"{baseline.name} runs in {cwd}, not in {root}")
        yield Target(baseline.name, gw.url, lambda: [gw.pid], str(folder), log)


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
        source = _code_folder(import_origins(["gateway"]))
        log = workdir / "gateway.log"
        gw = stack.enter_context(GatewayProcess(config=config, log=log))
        targets.append(Target("gateway", gw.url, lambda: [gw.pid], str(source), log))
        if baseline is not None:
            log = workdir / f"gateway-{baseline.short}.log"
            targets.append(stack.enter_context(baseline_gateway(baseline, config, log)))
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


async def closed_small(
    url: str, payload: bytes, connections: int, duration_s: float, pids: Sequence[int] = ()
) -> Samples:
    """`connections` users, each sending its next request as soon as the last one answered.
    The CPU of `pids` is counted over the timed window (after the warm-up)."""
    out = Samples()
    async with _session(connections) as session:
        await _warm(session, url, payload, connections)
        cpu0 = _cpu(pids)
        start = time.perf_counter()
        deadline = start + duration_s

        async def user() -> None:
            while (t0 := time.perf_counter()) < deadline:
                ok = await post_ok(session, url, payload)
                out.add(ok, time.perf_counter() - t0)

        await asyncio.gather(*(user() for _ in range(connections)))
        out.wall_s = time.perf_counter() - start
        out.cpu_s = _cpu(pids) - cpu0
    return out


async def paced_small(
    url: str,
    payload: bytes,
    connections: int,
    rate: float,
    duration_s: float,
    pids: Sequence[int] = (),
) -> Samples:
    """Open loop: `rate` requests/s in all, connection c sending at c/rate + k*connections/rate.
    Each latency is measured from the scheduled start, so a request that starts late because the
    previous one on its connection (or the client) was slow is charged for the wait."""
    out = Samples()
    period = connections / rate
    async with _session(connections) as session:
        await _warm(session, url, payload, connections)
        cpu0 = _cpu(pids)
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
        out.cpu_s = _cpu(pids) - cpu0
    return out


async def closed_ttft(
    url: str, body: dict[str, Any], connections: int, duration_s: float, pids: Sequence[int] = ()
) -> Samples:
    """`connections` streaming users in a closed loop; a sample is one stream's TTFT."""
    out = Samples()
    async with _session(connections) as session:
        await asyncio.gather(
            *(stream_completion(session, url, body, Result(u, 0, time.perf_counter()))
              for u in range(connections))
        )  # fmt: skip
        cpu0 = _cpu(pids)
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
        out.cpu_s = _cpu(pids) - cpu0
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


async def run_wrk(
    binary: str, target: Target, script: Path, seconds: int, connections: int, threads: int,
    timeout_s: int | None = None,
) -> WrkRun:  # fmt: skip
    pids = target.server_pids()
    cmd = [binary, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "-s", str(script),
           *([f"--timeout={timeout_s}s"] if timeout_s else []),
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
    cpu_s = _cpu(pids) - c0
    cores = cpu_s / (time.perf_counter() - t0)
    output = stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}:\n{output}")
    rps, requests, errors = parse_wrk(output)
    return WrkRun(rps, requests, errors, cores, cpu_s)


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
                    run = await run_wrk(
                        binary, target, script, opts.wrk_seconds, c, opts.wrk_threads,
                        opts.wrk_timeout_s,
                    )  # fmt: skip
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
        for what, new, old, ratio, per_round in (
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
                    f"{_ratio_x(ratio)} ({_ms(new)} vs {_ms(old)} ms; per round {rounds})",
                    None if math.isnan(ratio) else ratio <= MAX_BASELINE_RATIO,
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
            baseline: Baseline | None = None
            with console.status("starting the simulator, nginx and the gateways..."):
                if opts.baseline is not None:
                    baseline = stack.enter_context(checkout(opts.baseline, workdir))
                    if baseline.sha == _git("rev-parse", "HEAD"):
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
    head += ["CPU ms/request", "CPU ms/request per round"]
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
            cpu = cell.cpu[name]
            row += [_ms(cpu.ms_per_request), _per_round(cpu.rounds)]
            rows.append(row)
    return head, rows


def _per_round(values: Sequence[float], fmt: Callable[[float], str] | None = None) -> str:
    return " / ".join((fmt or _ms)(v) for v in values)


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
            f"{c.errors_new} / {c.errors_old}", _ms(figures[0]), _ms(figures[1]),
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


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


Section = tuple[str, list[str], list[list[str]]]  # title, header, rows


def run_header(command: str, options: dict[str, Any], drop: Sequence[str]) -> dict[str, Any]:
    """What opens a report: the command, the date, the machine, and the run's `options` less
    those in `drop` (paths as text)."""
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()
                if k not in drop}  # fmt: skip
    return {
        "command": command,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count() or 0,
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "settings": settings,
    }


@dataclass
class JsonReport:
    """A report kept as the JSON it is written as (what `save` writes), with its notes."""

    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.notes = self.data["notes"]

    def to_json(self) -> dict[str, Any]:
        return self.data


def print_tables(sections: Sequence[Section], console: Console, left: Sequence[str]) -> None:
    """Each section as a rich table (columns named in `left` aligned left, the rest right;
    a "Goals" section's rows coloured by their verdict); sections "Each round..." are left to
    the markdown. Then the goals' verdicts, one line each."""
    styles = {"MET": "bold green", "NOT MET": "bold red"}
    for title, head, rows in sections:
        if title.startswith("Each round"):
            continue
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="left" if h in left else "right")
        for row in rows:
            table.add_row(*row, style=styles.get(row[-1]) if title == "Goals" else None)
        console.print(table)
    for title, _, rows in sections:
        if title == "Goals":
            for goal, measured, word in rows:
                console.print(f"[{styles.get(word, '')}]{word}[/]: {goal} ({measured})")


def finish_markdown(
    parts: list[str],
    notes: Sequence[str],
    sections: Sequence[Section],
    chart: tuple[Path, str] | None,
) -> str:
    """A report's markdown: its opening `parts`, then its notes, its sections as tables and
    its chart (file, caption) when there is one."""
    parts = [*parts, *(f"- Note: {n}" for n in notes)]
    for title, head, rows in sections:
        parts += ["", f"## {title}", "", markdown_table(head, rows)]
    if chart is not None:
        parts += ["", f"![{chart[1]}]({chart[0].name})"]
    return "\n".join(parts) + "\n"


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


class Written(Protocol):
    """A benchmark's report as `save` writes it: JSON, markdown, and a chart when it can."""

    notes: list[str]

    def to_json(self) -> dict[str, Any]: ...


class Destinations(Protocol):
    @property
    def out(self) -> Path: ...

    @property
    def chart(self) -> bool: ...

    @property
    def markdown_path(self) -> Path: ...

    @property
    def chart_path(self) -> Path: ...


R = TypeVar("R", bound=Written)


def save(
    report: R,
    opts: Destinations,
    console: Console,
    draw: Callable[[R, Path], None],
    render: Callable[[R, Path | None], str],
) -> None:
    """Write `report` where `opts` say: its chart (`draw`, skipped with a note without
    matplotlib), its JSON and its markdown (`render`, given the chart's path)."""
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    png: Path | None = None
    if opts.chart:
        try:
            draw(report, opts.chart_path)
            png = opts.chart_path
        except ImportError:
            report.notes.append("chart skipped: matplotlib is not installed (extra `load`)")
    opts.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    opts.markdown_path.write_text(render(report, png))
    written = [opts.out, opts.markdown_path, *([png] if png else [])]
    console.print("wrote " + ", ".join(str(p) for p in written))


def write_outputs(report: Report, opts: Options, console: Console) -> None:
    save(report, opts, console, chart, markdown)
