"""`tiergate bench triton`: what translating OpenAI completions to Triton's generate API costs.

Two `instant` simulators run the same engine (no model time), one behind vLLM's OpenAI API and
one behind Triton's generate API and its gRPC stream. Six targets:

- `vllm`: the vLLM-API simulator called directly;
- `gateway->vllm`: a gateway in front of it (the pass-through path: bytes relayed as they come);
- `triton`: the Triton-API simulator called directly with generate requests;
- `gateway->triton`: a gateway in front of it, clients speaking OpenAI (every request and every
  stream event translated);
- `triton-grpc`: the same simulator's gRPC face called directly through tritonclient
  (ModelStreamInfer, one call per request on one channel);
- `gateway->triton-grpc`: a gateway sending to that gRPC face (`triton_grpc`), clients speaking
  OpenAI.

Each gateway's cost is its latency minus its direct target's; the translation's cost is what the
Triton path adds beyond what the pass-through path adds; gRPC vs HTTP is the gateway's latency
to Triton over gRPC over its latency over HTTP. Targets run in rotating order round by round and
samples pool over rounds, so drift on a shared machine spreads over all of them.

1. Small non-streamed requests: closed loop at 1 connection, open loop (paced, timed from the
   scheduled start) at more connections.
2. Streams of `stream_tokens` tokens, closed loop: time to the end of the stream, so every
   event's relay and translation is in the figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import grpc
import numpy as np
import tritonclient.grpc.aio as grpc_aio
import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from loadtests.common.options import setup_logging
from loadtests.common.stats import Added, Samples, Stat, json_safe, ms, rotation
from loadtests.harness.procs import GatewayProcess, SimProcess, cpu_seconds, start_all
from loadtests.harness.proxied import (
    JSON_HEADERS,
    PROFILE,
    client_session,
    closed_small,
    paced_small,
)

MODEL = "tiergate-bench"
TRITON_MODEL = "bench"
TARGETS = ("vllm", "gateway->vllm", "triton", "gateway->triton", "triton-grpc",
           "gateway->triton-grpc")  # fmt: skip
DIRECT = {"gateway->vllm": "vllm", "gateway->triton": "triton",
          "gateway->triton-grpc": "triton-grpc"}  # fmt: skip


@dataclass(frozen=True)
class Options:
    duration_s: float = 3.0  # per target per round, for each cell
    rounds: int = 3
    rate: float = 300.0  # aggregate req/s of the paced load
    latency_connections: tuple[int, ...] = (1, 64)
    stream_connections: tuple[int, ...] = (1, 16)
    stream_tokens: int = 128
    out: Path = Path("docs/results/triton.json")
    command: str | None = None

    @property
    def markdown_path(self) -> Path:
        return self.out.with_suffix(".md")


@dataclass(frozen=True)
class Cell:
    kind: str  # "small" or "stream"
    concurrency: int
    load: str
    stats: dict[str, Stat]
    added: dict[str, Added]  # by gateway target, over its direct target
    translation_p50_ms: float  # added(gateway->triton) - added(gateway->vllm)
    translation_p99_ms: float
    # The gateway's latency to Triton over gRPC divided by its latency over HTTP.
    grpc_vs_http_p50: float
    grpc_vs_http_p99: float
    # CPU the gateway process spent per request answered, by gateway target: steadier than
    # latency on a machine whose cores the client and the simulators share.
    gateway_cpu_ms: dict[str, float]


@dataclass
class Report:
    command: str
    date: str
    machine: str
    settings: dict[str, Any]
    cells: list[Cell]
    events: dict[str, int]  # SSE events in one stream, per target
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        clean: dict[str, Any] = json_safe(asdict(self))
        return clean


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # non-streamed requests go here
    stream_url: str
    small: bytes
    stream: bytes
    pid: int | None = None  # the gateway's process, for CPU accounting
    grpc: str | None = None  # host:port: a direct gRPC target (url and bodies unused)


def _openai(tokens: int, stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body).encode()


def _generate(tokens: int, stream: bool) -> bytes:
    params = {
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
        "exclude_input_in_output": True,
        "return_num_output_tokens": True,
    }
    return json.dumps({"text_input": "hello", "parameters": params}).encode()


def _gateway_config(url: str, kind: str, grpc: str | None = None) -> dict[str, Any]:
    backend: dict[str, Any] = {"url": url, "models": [MODEL], "kind": kind}
    if kind == "triton":
        backend["triton_models"] = {MODEL: TRITON_MODEL}
    if grpc is not None:
        backend["triton_grpc"] = grpc
    return {
        "tiers": [{"name": "pool", "role": "throughput", "backends": [backend]}],
        "log_level": "warning",
    }


@contextlib.contextmanager
def running_targets(workdir: Path, opts: Options) -> Iterator[list[Target]]:
    with contextlib.ExitStack() as stack:
        vllm = SimProcess(profile=PROFILE, log=workdir / "vllm.log", args=["--model", MODEL])
        triton = SimProcess(
            profile=PROFILE,
            api="triton",
            grpc_port=0,
            log=workdir / "triton.log",
            args=["--model", TRITON_MODEL],
        )
        start_all(stack, vllm, triton)
        gateways = {}
        for name, kind, sim, grpc in (
            ("vllm", "vllm", vllm, None),
            ("triton", "triton", triton, None),
            ("triton-grpc", "triton", triton, triton.grpc_target),
        ):
            config = workdir / f"gateway-{name}.yaml"
            config.write_text(yaml.safe_dump(_gateway_config(sim.url, kind, grpc)))
            gateways[name] = GatewayProcess(config=config, log=workdir / f"gateway-{name}.log")
        start_all(stack, *gateways.values())
        small, stream = _openai(4, False), _openai(opts.stream_tokens, True)

        def openai_target(name: str, base: str, pid: int | None = None) -> Target:
            url = base + "/v1/completions"
            return Target(name, url, url, small, stream, pid)

        generate = f"{triton.url}/v2/models/{TRITON_MODEL}/generate"
        yield [
            openai_target("vllm", vllm.url),
            openai_target("gateway->vllm", gateways["vllm"].url, gateways["vllm"].pid),
            Target(
                "triton",
                generate,
                generate + "_stream",
                _generate(4, False),
                _generate(opts.stream_tokens, True),
            ),
            openai_target("gateway->triton", gateways["triton"].url, gateways["triton"].pid),
            Target("triton-grpc", "", "", b"", b"", grpc=triton.grpc_target),
            openai_target(
                "gateway->triton-grpc", gateways["triton-grpc"].url, gateways["triton-grpc"].pid
            ),
        ]


async def _stream_once(session: aiohttp.ClientSession, url: str, payload: bytes) -> int | None:
    """Read one whole stream; its `data:` events, or None when it failed."""
    try:
        async with session.post(url, data=payload, headers=JSON_HEADERS) as resp:
            body = await resp.read()
            if resp.status != 200 or b'"error"' in body:
                return None
            return body.count(b"data:")
    except (TimeoutError, aiohttp.ClientError):
        return None


async def closed_streams(url: str, payload: bytes, connections: int, duration_s: float) -> Samples:
    """`connections` users reading whole streams back to back; a sample is one stream's time."""
    out = Samples()
    async with client_session(connections) as session:
        await asyncio.gather(*(_stream_once(session, url, payload) for _ in range(connections)))
        start = time.perf_counter()
        deadline = start + duration_s

        async def user() -> None:
            while (t0 := time.perf_counter()) < deadline:
                events = await _stream_once(session, url, payload)
                out.add(events is not None, time.perf_counter() - t0)

        await asyncio.gather(*(user() for _ in range(connections)))
        out.wall_s = time.perf_counter() - start
    return out


def _grpc_request(tokens: int, stream: bool) -> dict[str, Any]:
    """The direct gRPC target's request: what `_generate` asks for, as tensors."""

    def tensor(name: str, datatype: str, value: Any) -> InferInput:
        t = InferInput(name, [1], datatype)
        t.set_data_from_numpy(np.array([value], dtype=np.object_ if datatype == "BYTES" else bool))
        return t

    return {
        "model_name": TRITON_MODEL,
        "inputs": [tensor("text_input", "BYTES", b"hello"), tensor("stream", "BOOL", stream),
                   tensor("exclude_input_in_output", "BOOL", True),
                   tensor("return_num_output_tokens", "BOOL", True)],
        "parameters": {"max_tokens": tokens, "ignore_eos": True},
    }  # fmt: skip


async def _grpc_once(client: Any, request: dict[str, Any]) -> int | None:
    """One request through ModelStreamInfer, read to its final response: the responses, or
    None when it failed."""
    end = asyncio.Event()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield dict(request)
        await end.wait()

    n = 0
    try:
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                return None
            n += 1
            if result.get_response().parameters["triton_final_response"].bool_param:
                return n
    except (InferenceServerException, grpc.RpcError):
        return None
    finally:
        end.set()
    return None


async def _grpc_loop(t: Target, kind: str, c: int, opts: Options) -> Samples:
    """The direct gRPC target under the same loads as the HTTP targets (`closed_small`,
    `paced_small`, `closed_streams`): `c` users on one channel."""
    assert t.grpc is not None
    stream = kind == "stream"
    request = _grpc_request(opts.stream_tokens if stream else 4, stream)
    out = Samples()
    async with grpc_aio.InferenceServerClient(t.grpc) as client:
        await asyncio.gather(*(_grpc_once(client, request) for _ in range(c)))
        start = time.perf_counter()
        ends = [start]
        paced = kind == "small" and c > 1

        async def user(i: int) -> None:
            due = start + i / opts.rate if paced else start
            while due < start + opts.duration_s:
                if paced and (delay := due - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                t0 = due if paced else time.perf_counter()
                ok = await _grpc_once(client, request) is not None
                end = time.perf_counter()
                out.add(ok, end - t0)
                ends.append(end)
                due = due + c / opts.rate if paced else end

        await asyncio.gather(*(user(i) for i in range(c)))
        out.wall_s = max(ends) - start
    return out


async def _measure(targets: list[Target], opts: Options, progress: Progress) -> Report:
    by_name = {t.name: t for t in targets}
    cells = [("small", c) for c in opts.latency_connections]
    cells += [("stream", c) for c in opts.stream_connections]
    pooled: dict[tuple[str, int, str], Samples] = {}
    cpu: dict[tuple[str, int, str], float] = {}
    events: dict[str, int] = {}
    async with client_session(1) as session:
        for t in targets:
            if t.grpc is not None:
                async with grpc_aio.InferenceServerClient(t.grpc) as client:
                    n = await _grpc_once(client, _grpc_request(opts.stream_tokens, True))
            else:
                n = await _stream_once(session, t.stream_url, t.stream)
            if n is None:
                raise RuntimeError(f"{t.name}: a stream from {t.stream_url} failed")
            events[t.name] = n
    task = progress.add_task("triton", total=opts.rounds * len(cells) * len(targets))
    for r in range(opts.rounds):
        for kind, c in cells:
            for name in rotation(TARGETS, r):
                t = by_name[name]
                progress.update(
                    task, description=f"round {r + 1}/{opts.rounds}  {kind} c={c:<4} {name}"
                )
                cpu0 = cpu_seconds(t.pid) if t.pid else 0.0
                if t.grpc is not None:
                    s = await _grpc_loop(t, kind, c, opts)
                elif kind == "stream":
                    s = await closed_streams(t.stream_url, t.stream, c, opts.duration_s)
                elif c == 1:
                    s = await closed_small(t.url, t.small, c, opts.duration_s)
                else:
                    s = await paced_small(t.url, t.small, c, opts.rate, opts.duration_s)
                if t.pid:
                    used = cpu_seconds(t.pid) - cpu0
                    cpu[(kind, c, name)] = cpu.get((kind, c, name), 0.0) + used
                into = pooled.setdefault((kind, c, name), Samples())
                into.values += s.values
                into.errors += s.errors
                into.wall_s += s.wall_s
                progress.advance(task)
    out: list[Cell] = []
    for kind, c in cells:
        stats = {name: Stat.of(pooled[(kind, c, name)]) for name in TARGETS}
        added = {gw: Added.of(stats[gw], stats[direct]) for gw, direct in DIRECT.items()}
        load = "closed loop" if kind == "stream" or c == 1 else f"open loop, {opts.rate:g} req/s"
        out.append(
            Cell(
                kind,
                c,
                load,
                stats,
                added,
                added["gateway->triton"].p50_ms - added["gateway->vllm"].p50_ms,
                added["gateway->triton"].p99_ms - added["gateway->vllm"].p99_ms,
                stats["gateway->triton-grpc"].p50_ms / stats["gateway->triton"].p50_ms,
                stats["gateway->triton-grpc"].p99_ms / stats["gateway->triton"].p99_ms,
                {
                    gw: 1000
                    * cpu.get((kind, c, gw), 0.0)
                    / max(1, len(pooled[(kind, c, gw)].values))
                    for gw in DIRECT
                },
            )
        )
    return Report(
        command=opts.command or shlex.join(["tiergate", *sys.argv[1:]]),
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=f"{platform.machine()}, {_cores()} cores, Python {platform.python_version()}",
        settings={
            "duration_s": opts.duration_s,
            "rounds": opts.rounds,
            "rate": opts.rate,
            "stream_tokens": opts.stream_tokens,
            "profile": PROFILE,
        },
        cells=out,
        events=events,
    )


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cell_title(c: Cell, tokens: int) -> str:
    what = "small non-streamed" if c.kind == "small" else f"{tokens}-token streams, whole stream"
    return f"{what}, {c.concurrency} conn ({c.load})"


def _per_event_us(c: Cell, tokens: int) -> float:
    """The translation's CPU per stream event (one token per event from the simulator)."""
    return 1000 * (c.gateway_cpu_ms["gateway->triton"] - c.gateway_cpu_ms["gateway->vllm"]) / tokens


def markdown(report: Report) -> str:
    tokens = int(report.settings["stream_tokens"])
    lines = [
        "# The Triton translation's cost",
        "",
        f"`{report.command}`, {report.date}, {report.machine}. Two `instant` simulators (the "
        "same engine behind vLLM's API and behind Triton's generate API and gRPC stream), each "
        "called directly and through its own gateway worker (one gateway per Triton protocol); "
        "targets in rotating order over "
        f"{report.settings['rounds']} rounds of {report.settings['duration_s']:g} s per cell. "
        "Client, simulators and gateways share the machine's cores.",
        "",
        "*added* = gateway minus its direct target; *translation* = what the Triton path adds "
        "beyond the pass-through (vLLM) path; *gRPC / HTTP* = the gateway's latency to Triton "
        "over gRPC divided by its latency over HTTP (clients speak OpenAI to both). The direct "
        "gRPC target is tritonclient's asyncio client, one call per request on one channel. "
        "SSE events (gRPC: responses) per stream: "
        + ", ".join(f"{k} {v}" for k, v in report.events.items())
        + ".",
        "",
    ]
    for c in report.cells:
        lines += [
            f"## {_cell_title(c, tokens)}",
            "",
            "| target | n | errors | p50 ms | p99 ms | added p50 ms | added p99 ms |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in TARGETS:
            s = c.stats[name]
            a = c.added.get(name)
            lines.append(
                f"| {name} | {s.n} | {s.errors} | {ms(s.p50_ms, 2)} | {ms(s.p99_ms, 2)} | "
                f"{ms(a.p50_ms, 2) if a else ''} | {ms(a.p99_ms, 2) if a else ''} |"
            )
        lines += [
            "",
            f"Translation: {ms(c.translation_p50_ms, 2)} ms p50, "
            f"{ms(c.translation_p99_ms, 2)} ms p99."
            f" Gateway CPU per request: {ms(c.gateway_cpu_ms['gateway->vllm'], 2)} ms to vLLM,"
            f" {ms(c.gateway_cpu_ms['gateway->triton'], 2)} ms to Triton"
            + (
                f" ({_per_event_us(c, tokens):.0f} us more per streamed token)"
                if c.kind == "stream"
                else ""
            )
            + f", {ms(c.gateway_cpu_ms['gateway->triton-grpc'], 2)} ms to Triton over gRPC.",
            "",
            f"gRPC / HTTP (gateway to Triton): {c.grpc_vs_http_p50:.3f}x p50, "
            f"{c.grpc_vs_http_p99:.3f}x p99.",
            "",
        ]
    lines += [*(f"- {n}" for n in report.notes)]
    return "\n".join(lines).rstrip() + "\n"


def print_summary(report: Report, console: Console) -> None:
    tokens = int(report.settings["stream_tokens"])
    table = Table(title="gateway's added latency, ms (p50 / p99), and the translation's share")
    cols = ("cell", "gateway->vllm", "gateway->triton", "gateway->triton-grpc", "translation",
            "gRPC/HTTP p50", "CPU ms/req v | t | g", "n")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col == "cell" else "right")
    for c in report.cells:
        v, t = c.added["gateway->vllm"], c.added["gateway->triton"]
        g = c.added["gateway->triton-grpc"]
        table.add_row(
            f"{'small' if c.kind == 'small' else f'{tokens}-tok stream'} c={c.concurrency}",
            f"{ms(v.p50_ms, 2)} / {ms(v.p99_ms, 2)}",
            f"{ms(t.p50_ms, 2)} / {ms(t.p99_ms, 2)}",
            f"{ms(g.p50_ms, 2)} / {ms(g.p99_ms, 2)}",
            f"{ms(c.translation_p50_ms, 2)} / {ms(c.translation_p99_ms, 2)}",
            f"{c.grpc_vs_http_p50:.3f}x",
            " | ".join(ms(c.gateway_cpu_ms[gw], 2) for gw in DIRECT),
            str(min(s.n for s in c.stats.values())),
        )
    console.print(table)


def run(opts: Options, console: Console | None = None) -> Report:
    console = console or Console()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    load_before = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="tiergate-triton-") as tmp,
        running_targets(Path(tmp), opts) as targets,
        Progress(*columns, console=console) as progress,
    ):
        report = asyncio.run(_measure(targets, opts, progress))
    # Latency on a shared machine is only as good as its quiet: say how quiet it was.
    report.notes.append(
        f"1-minute load average {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at "
        f"the end, on {_cores()} cores."
    )
    errors = sum(s.errors for c in report.cells for s in c.stats.values())
    if errors:
        report.notes.append(f"{errors} requests failed in all (per target in the tables).")
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    opts.markdown_path.write_text(markdown(report))
    print_summary(report, console)
    console.print(f"wrote {opts.out} and {opts.markdown_path}")
    return report


# -- the command ------------------------------------------------------------------------------


def command(
    duration: Annotated[float, typer.Option(help="Seconds per target per round, per cell.")] = 3.0,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (targets in rotating order).")] = 3,
    rate: Annotated[
        float, typer.Option(min=1, help="Aggregate req/s of the paced small-request load.")
    ] = 300.0,
    stream_tokens: Annotated[int, typer.Option(min=1, help="Tokens per timed stream.")] = 128,
    out: Annotated[Path, typer.Option(help="JSON results; the .md is written next to it.")] = Path(
        "docs/results/triton.json"
    ),
) -> None:
    """What the Triton translation costs: the gateway in front of a Triton-API simulator vs the
    same gateway in front of the same engine behind vLLM's API, each against its direct target."""

    setup_logging("warning")
    run(Options(duration_s=duration, rounds=rounds, rate=rate, stream_tokens=stream_tokens,
                out=out))  # fmt: skip
