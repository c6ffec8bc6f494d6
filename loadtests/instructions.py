"""`tiergate bench instructions`: the gateway's CPU per request as a count of instructions,
against the gateway of another commit, or against this tree's own gateway under other settings
(`--setting policy.prefix_affinity=false`: what a setting costs, with nothing else different:
the same files, paths and imports, which a commit extracted elsewhere does not keep).

Times on a shared machine drift by ±10% from one minute to the next, more than the differences
worth knowing about in the request path. Instructions executed do not: each gateway runs under
valgrind's callgrind, in front of the same `instant` simulator, with periodic scraping switched
off (a long scrape interval), and serves the same requests one after another on one keep-alive
connection. After a warm-up the counters are zeroed (`callgrind_control -z`), `requests` more
requests go through, and the total (`callgrind_control -e Ir`) divided by their number is the
gateway's instructions per request: the whole process, uvicorn, aiohttp and Python included.
The same count repeated gives the same figure to well under 1% (the report shows each round), so
a 5% difference is a real one.

Three kinds of request: small non-streamed completions (4 tokens), streams of 64 tokens with
usage (66 SSE events each), and the same streams whose client did not ask for usage (the OpenAI
SDK's default: the gateway asks the engine for it all the same and takes the usage event out of
what the client gets). Both gateways run the routing modules from their sources
(`TIERGATE_COMPILED=0`): an extracted commit has no compiled build, and the comparison is of the
code, not of the build. `--backends N` puts N simulators in the pool (where prefix affinity
and the policy's choice have work to do), and `--one-off` makes every request's prompt one never
sent before (what affinity costs where nothing repeats). Under callgrind a gateway starts in
about a minute and a half; a run with a baseline takes a few minutes.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from engines.sim.profile import load_profile
from loadtests.common.options import setup_logging
from loadtests.harness.baseline import Baseline, checkout, import_origins
from loadtests.harness.procs import GatewayProcess, SimProcess
from loadtests.harness.proxied import gateway_config, small_body, stream_body

PROFILE = "instant"
# --paced: 2 ms a step, so that a stream's events reach the gateway one read each, as from a real
# engine (a decode step apart). From `instant`, a gateway slowed by callgrind finds several
# events in a read, as many as the timing of the moment puts there, so the reads of a stream,
# and their work, vary between processes.
PACED = "paced"
KINDS = ("small", "stream", "stream-no-usage")
_LABELS = {"small": "small (4 tokens)", "stream": "stream (64 tokens, 66 events)",
           "stream-no-usage": "stream, no usage asked (64 tokens, 65 events out)"}  # fmt: skip
MAX_RATIO = 1.05  # the working tree's gateway against the baseline's
_WARMUP = 50  # requests of a kind before it is counted
_TOTAL = re.compile(r"^\s*(?:Th\s+\d+\s+)?([\d,]+)\s*$")


@dataclass(frozen=True)
class Options:
    baseline: str = "HEAD"
    # KEY=VALUE settings (dotted keys of the gateway's configuration): when given, the baseline
    # is this tree's gateway with them, not another commit's.
    settings: tuple[str, ...] = ()
    requests: int = 400  # counted requests per kind, per round
    warmup: int = _WARMUP  # before the first kind; each later kind is warmed by _WARMUP
    rounds: int = 2  # the count repeated, to show how exactly it repeats
    backends: int = 1  # simulators in the pool
    one_off: bool = False  # each request's prompt one never sent before
    paced: bool = False  # the simulators' steps 2 ms apart (PACED), not instant
    out: Path = Path("docs/results/instructions.json")


# --- callgrind --------------------------------------------------------------------------------


def valgrind() -> str | None:
    """The valgrind binary, when valgrind and its callgrind_control are installed."""
    if shutil.which("callgrind_control") is None:
        return None
    return shutil.which("valgrind")


def callgrind_prefix(out: Path) -> list[str]:
    binary = valgrind()
    if binary is None:
        raise RuntimeError("valgrind (with callgrind_control) is not installed: apt-get install "
                           "valgrind")  # fmt: skip
    return [binary, "--tool=callgrind", f"--callgrind-out-file={out}"]


def parse_totals(text: str) -> int:
    """The instructions counted so far, from `callgrind_control -e Ir`: the lines after
    "Totals:", one per thread (`Th 1  146,703,008`) or one in all."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("Totals:")]
    if not starts:
        raise ValueError(f"no totals in callgrind_control's output:\n{text}")
    total = 0
    for line in lines[starts[-1] + 1 :]:
        if not line.strip():
            continue
        match = _TOTAL.match(line)
        if match is None:
            break
        total += int(match.group(1).replace(",", ""))
    return total


def _control(pid: int, *args: str) -> str:
    proc = subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind_control {shlex.join(args)} {pid}: {proc.stderr.strip()}")
    return proc.stdout


def zero(pid: int) -> None:
    _control(pid, "-z")


def instructions(pid: int) -> int:
    return parse_totals(_control(pid, "-e", "Ir"))


@dataclass
class CallgrindGateway(GatewayProcess):
    """`serve` under callgrind, from the working tree or from an extracted commit (`root`)."""

    root: Path | None = None
    module: str = "tiergate"
    out: Path = Path("callgrind.out")

    def command(self) -> list[str]:
        # This interpreter (the virtual environment's link to the binary, so that its packages
        # are found); valgrind follows no exec, so it must not be a wrapper script. -P, as
        # every process of the harness (ManagedProcess.command): the code comes from
        # PYTHONPATH (`environment`), not from the working directory.
        cmd = [*callgrind_prefix(self.out), sys.executable, "-P", "-m", self.module,
               *self.argv()]  # fmt: skip
        return cmd if self.root is None else ["env", "-C", str(self.root), *cmd]


# --- measuring ------------------------------------------------------------------------------------


@dataclass
class Cell:
    target: str
    kind: str
    requests: int
    per_request: list[float] = field(default_factory=list)  # one per round

    @property
    def median(self) -> float:
        return statistics.median(self.per_request)


def _post(conn: http.client.HTTPConnection, payload: bytes) -> None:
    conn.request("POST", "/v1/completions", body=payload,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"the gateway answered {r.status}")


def payloads(body: dict[str, Any], one_off: bool, serial: Iterator[int]) -> Iterator[bytes]:
    """Request bodies: `body` again and again, or (`one_off`) with the next number of `serial`
    appended to its prompt. One serial for every kind a gateway process counts: a kind that
    began its numbers anew would send the prompts of the kind before it again, and prefix
    affinity, finding them remembered, would route them as repeats (measured so: one-off
    streams after one-off small requests woke the quiet memory up in every stream)."""
    fixed = json.dumps(body).encode()
    while True:
        # The same length every time, so that only its newness differs from the fixed one.
        yield (json.dumps(body | {"prompt": f"{body['prompt']} {next(serial):08d}"}).encode()
               if one_off else fixed)  # fmt: skip


def count(gw: GatewayProcess, body: dict[str, Any], opts: Options, warmup: int,
          serial: Iterator[int]) -> float:  # fmt: skip
    """Instructions per request: `warmup` requests, zero, `opts.requests` requests, read the
    total (`serial`: the gateway process's, for one-off prompts)."""
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=300)
    bodies = payloads(body, opts.one_off, serial)
    try:
        for _ in range(warmup):
            _post(conn, next(bodies))
        zero(gw.pid)
        for _ in range(opts.requests):
            _post(conn, next(bodies))
        return instructions(gw.pid) / opts.requests
    finally:
        conn.close()


def with_settings(cfg: dict[str, Any], settings: tuple[str, ...]) -> dict[str, Any]:
    """`cfg` with each KEY=VALUE of `settings` set (a dotted KEY into its sections, the VALUE
    read as YAML: `false`, `16`, `0.5`, text), a new dict; `cfg` is left as it was."""
    out: dict[str, Any] = json.loads(json.dumps(cfg))
    for setting in settings:
        key, sep, value = setting.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise ValueError(f"a setting is KEY=VALUE with a dotted KEY, not {setting!r}")
        node = out
        for part in path[:-1]:
            inner = node.setdefault(part, {})
            if not isinstance(inner, dict):
                raise ValueError(f"{key}: {part} is a value, not a section")
            node = inner
        node[path[-1]] = yaml.safe_load(value)
    return out


@dataclass(frozen=True)
class _Reference:
    """What the working tree is compared with: another commit's code, or its own under other
    settings."""

    name: str
    baseline: Baseline | None  # None: the working tree's own code
    config: Path

    def describe(self) -> dict[str, Any]:
        b = self.baseline
        return {"ref": b and b.ref, "sha": b and b.sha, "name": self.name}


def config(sim_urls: list[str], model: str) -> dict[str, Any]:
    # The overhead benchmark's gateway, with scraping switched off after the first round: its
    # cost would land in whichever request's window it fell into. Health and readiness come
    # from that first scrape.
    monitor = {"scrape_interval_s": 100_000, "probe_interval_s": 100_000}
    cfg = gateway_config(sim_urls[0], model)
    cfg["tiers"][0]["backends"] = [{"url": u, "models": [model]} for u in sim_urls]
    return {**cfg, "monitor": monitor}


@contextlib.contextmanager
def _gateway(name: str, work: Path, cfg: Path, baseline: Baseline | None,
             ) -> Iterator[CallgrindGateway]:  # fmt: skip
    sources = {"TIERGATE_COMPILED": "0"}  # see the module's docstring
    if baseline is None:
        gw = CallgrindGateway(config=cfg, log=work / f"{name}.log", out=work / f"{name}.cg",
                              env=sources)  # fmt: skip
    else:
        root = Path(baseline.folder)
        env = {"PYTHONPATH": str(root), **sources}
        origin = import_origins(["gateway"], cwd=root, env=env)["gateway"]
        if origin.resolve().parents[1] != root:
            raise RuntimeError(f"{name} would import its code from {origin}, not {root}")
        gw = CallgrindGateway(config=cfg, log=work / f"{name}.log", out=work / f"{name}.cg",
                              env=env, root=root, module=baseline.module)  # fmt: skip
    gw.start(timeout=900)
    try:
        yield gw
    finally:
        gw.stop()


def run(opts: Options, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    profile = PACED if opts.paced else PROFILE
    model = load_profile(profile).model
    bodies = {"small": small_body(model), "stream": stream_body(model, 64, usage=True),
              "stream-no-usage": stream_body(model, 64, usage=False)}  # fmt: skip
    cells: dict[tuple[str, str], Cell] = {}
    with tempfile.TemporaryDirectory(prefix="tiergate-instructions-") as tmp:
        work = Path(tmp)
        with contextlib.ExitStack() as stack:
            sims = [stack.enter_context(SimProcess(profile=profile, log=work / f"sim-{i}.log",
                                                   args=["--model", model]))
                    for i in range(opts.backends)]  # fmt: skip
            cfg = work / "gateway.yaml"
            plain = config([s.url for s in sims], model)
            cfg.write_text(yaml.safe_dump(plain))
            ref = _reference(opts, plain, cfg, stack)
            targets: list[tuple[str, Path, Baseline | None]] = [
                ("gateway", cfg, None), (ref.name, ref.config, ref.baseline)]  # fmt: skip
            for r in range(opts.rounds):
                for name, conf, baseline in targets if r % 2 == 0 else targets[::-1]:
                    started = time.perf_counter()
                    status = f"round {r + 1}/{opts.rounds}: {name} under callgrind"
                    with console.status(status), _gateway(name, work, conf, baseline) as gw:
                        serial = itertools.count()  # one for the process: see `payloads`
                        for i, kind in enumerate(KINDS):
                            cell = cells.setdefault((name, kind), Cell(name, kind, opts.requests))
                            warmup = opts.warmup if i == 0 else _WARMUP
                            cell.per_request.append(
                                count(gw, bodies[kind], opts, warmup, serial))
                    console.print(f"round {r + 1}: {name} counted in "
                                  f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        report = _report(opts, ref, list(cells.values()))
    _write(report, opts, console)
    return report


def _reference(
    opts: Options, plain: dict[str, Any], cfg: Path, stack: contextlib.ExitStack
) -> _Reference:
    """The baseline: this tree under `opts.settings` (a configuration of its own beside `cfg`,
    which holds `plain`), or `opts.baseline`'s commit under `cfg` itself."""
    if opts.settings:
        conf = cfg.with_name("gateway-settings.yaml")
        conf.write_text(yaml.safe_dump(with_settings(plain, opts.settings)))
        return _Reference("gateway with " + ", ".join(opts.settings), None, conf)
    base = stack.enter_context(checkout(opts.baseline, cfg.parent))
    return _Reference(base.name, base, cfg)


def _report(opts: Options, ref: _Reference, cells: list[Cell]) -> dict[str, Any]:
    by = {(c.target, c.kind): c for c in cells}
    rows = []
    for kind in KINDS:
        new, old = by[("gateway", kind)], by[(ref.name, kind)]
        ratio = new.median / old.median
        rows.append({"kind": kind, "requests": opts.requests, "gateway": new.per_request,
                     "baseline": old.per_request, "ratio": ratio,
                     "met": ratio <= MAX_RATIO})  # fmt: skip
    return {
        "command": shlex.join(["tiergate", "bench", "instructions", *sys.argv[3:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "options": {k: str(v) for k, v in asdict(opts).items()},
        "baseline": ref.describe(),
        "rows": rows,
    }


def _sims(n: int, paced: bool) -> str:
    name = f"`{PACED}` (2 ms a step)" if paced else f"`{PROFILE}`"
    return f"one {name} simulator" if n == 1 else f"{n} {name} simulators (one pool)"


def _fmt(v: float) -> str:
    return f"{v:,.0f}"


def _write(report: dict[str, Any], opts: Options, console: Console) -> None:
    base = report["baseline"]["name"]
    head = ["request", "n per round", "gateway", base, "gateway / baseline", "verdict",
            "gateway per round", f"{base} per round"]  # fmt: skip
    rows = []
    for row in report["rows"]:
        g, b = row["gateway"], row["baseline"]
        rows.append([
            _LABELS[row["kind"]],
            str(row["requests"]), _fmt(statistics.median(g)), _fmt(statistics.median(b)),
            f"{row['ratio']:.3f}x", "MET" if row["met"] else "NOT MET",
            " / ".join(_fmt(v) for v in g), " / ".join(_fmt(v) for v in b),
        ])  # fmt: skip
    table = Table(title="Gateway instructions per request (callgrind)")
    for h in head:
        table.add_column(h, justify="left" if h == "request" else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    md = [
        "# Gateway instructions per request",
        "",
        f"- Command: `{report['command']}`",
        f"- Date: {report['date']}; {report['machine']}",
        _baseline_line(report["baseline"], opts),
        "- Each gateway runs under valgrind's callgrind in front of"
        f" {_sims(opts.backends, opts.paced)}, with periodic scraping off, and serves requests"
        f" one after another on one keep-alive connection: {opts.warmup} to warm up (each later"
        f" kind {_WARMUP}), then the counters"
        f" are zeroed and {opts.requests} requests of each kind are counted. Instructions of"
        " the whole gateway process (uvicorn, aiohttp, Python) divided by the requests; the"
        " median over rounds (each round a fresh process, targets alternating). Both run the"
        " routing modules from their sources (`TIERGATE_COMPILED=0`). A stream with no usage"
        " asked: the gateway asks the engine for it and takes the usage event out."
        + (" Every request's prompt is one never sent before (a serial number appended)."
           if opts.one_off else " Every request is the same."),
        f"- Criterion: the working tree's gateway no more than {MAX_RATIO:.2f}x the baseline's.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]
    opts.out.with_suffix(".md").write_text("\n".join(md))
    console.print(f"wrote {opts.out}, {opts.out.with_suffix('.md')}")


def _baseline_line(base: dict[str, Any], opts: Options) -> str:
    if base["ref"] is None:
        settings = ", ".join(f"`{s}`" for s in opts.settings)
        return (f"- Baseline: the same tree's gateway with {settings} in its configuration"
                " (the same code, files and paths; only the setting differs).")  # fmt: skip
    return (f"- Baseline: `{base['ref']}` = {base['sha']}, extracted with `git archive` and run"
            " from its own folder.")  # fmt: skip


# -- the command ------------------------------------------------------------------------------


def command(
    baseline: Annotated[
        str, typer.Option("--baseline", metavar="REF", help="Git ref whose gateway is compared.")
    ] = "HEAD",
    setting: Annotated[
        list[str] | None,
        typer.Option(
            "--setting",
            metavar="KEY=VALUE",
            help="Compare with this tree's own gateway under this setting (a dotted key of the"
            " configuration, e.g. policy.prefix_affinity=false; repeatable) instead of"
            " another commit's: what the setting costs, with nothing else different.",
        ),
    ] = None,
    requests: Annotated[
        int, typer.Option(min=1, help="Counted requests per kind and round.")
    ] = 400,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (a fresh process each).")] = 2,
    warmup: Annotated[
        int,
        typer.Option(
            min=0,
            help=f"Requests before the first kind is counted (each later kind: {_WARMUP})."
            " With --one-off, more than policy.affinity_quiet_after (1,024 by default) counts"
            " the gateway in the state where nothing has repeated lately.",
        ),
    ] = _WARMUP,
    backends: Annotated[
        int, typer.Option(min=1, help="Simulators in the pool (2+: the routing stages work).")
    ] = 1,
    one_off: Annotated[
        bool,
        typer.Option(
            "--one-off/--repeated",
            help="Each request's prompt one never sent before, or all alike.",
        ),
    ] = False,
    paced: Annotated[
        bool,
        typer.Option(
            "--paced/--instant",
            help="Simulators whose steps are 2 ms apart, so that each of a stream's events"
            " reaches the gateway in a read of its own, as from a real engine (exact from"
            " process to process), or instant ones (several events a read, as many as the"
            " moment's timing puts there).",
        ),
    ] = False,
    out: Annotated[Path, typer.Option(help="JSON results; the .md is written next to it.")] = Path(
        "docs/results/instructions.json"
    ),
) -> None:
    """The gateway's CPU per request as instructions counted by valgrind's callgrind (exact
    where timings drift), against the gateway of another commit or (--setting) against its own
    under other settings: small requests and streams."""

    setup_logging("warning")
    settings = tuple(setting or ())
    if settings and baseline != "HEAD":
        raise typer.BadParameter("--setting compares with this tree itself: give no --baseline")
    try:
        with_settings({}, settings)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--setting") from None
    run(Options(baseline=baseline, settings=settings, requests=requests, rounds=rounds,
                backends=backends, one_off=one_off, paced=paced, out=out,
                warmup=warmup))  # fmt: skip
