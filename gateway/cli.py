"""The `tiergate` command line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="tiergate: an OpenAI-compatible gateway that puts each request on the LLM serving tier "
    "that answers it best right now.",
    no_args_is_help=True,
    add_completion=False,
)
bench = typer.Typer(help="Benchmarks (each prints its measurements and their sample counts).")
app.add_typer(bench, name="bench")


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


class SimApi(StrEnum):
    VLLM = "vllm"
    TRITON = "triton"


@app.command()
def sim(
    profile: Annotated[
        str, typer.Option(help="Profile name (v0..v4, instant) or path to a profile YAML.")
    ] = "v3",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8201,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    model: Annotated[
        list[str] | None,
        typer.Option(help="Served model name (repeat for aliases). Default: the profile's."),
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="Override the profile's running-batch limit.")
    ] = None,
    num_gpu_blocks: Annotated[
        int | None, typer.Option(help="Override the KV-cache capacity, in blocks of 16 tokens.")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Override the context length.")] = None,
    speedup: Annotated[
        float, typer.Option(help="Run the same scheduler N times faster than real time.")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the speculative-acceptance RNG.")] = 0,
    api_key: Annotated[
        str | None, typer.Option(envvar="VLLM_API_KEY", help="Require this bearer token on /v1.")
    ] = None,
    fault_error_rate: Annotated[
        float, typer.Option(help="Share of requests failing with 500.")
    ] = 0,
    fault_slow_first_token: Annotated[
        float, typer.Option(help="Extra seconds before every first token.")
    ] = 0,
    fault_hang: Annotated[bool, typer.Option(help="Accept requests but never answer.")] = False,
    fault_crash_after: Annotated[
        int | None, typer.Option(help="Exit the process after this many requests.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "warning",
    api: Annotated[
        SimApi,
        typer.Option(
            help="The API to serve: vLLM's OpenAI server, or Triton with the vLLM backend "
            "(/v2 generate; --model is then the Triton model name, default llama31-8b-awq).",
        ),
    ] = SimApi.VLLM,
    metrics_port: Annotated[
        int | None, typer.Option(help="Triton: serve /metrics on this port only (Triton's 8002).")
    ] = None,
) -> None:
    """Run a simulated vLLM engine: vLLM's OpenAI API and metrics, with a real-time
    continuous-batching scheduler calibrated to the tutorial's tables (no GPU needed)."""
    import uvicorn

    from engines.sim.faults import Faults
    from engines.sim.profile import load_profile
    from engines.sim.server import SimConfig, create_app

    _logging(log_level)
    prof = load_profile(profile).with_overrides(
        max_num_seqs=max_num_seqs, num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len
    )
    faults = Faults(
        error_rate=fault_error_rate,
        slow_first_token_s=fault_slow_first_token,
        hang=fault_hang,
        crash_after=fault_crash_after,
    )
    if api is SimApi.TRITON:
        from engines.sim import triton

        # Triton has no bearer-token auth: --api-key (or VLLM_API_KEY) does not apply.
        names = list(model or [TRITON_MODEL])
        if len(names) != 1 or "/" in names[0]:
            raise typer.BadParameter("one Triton model name, without '/'", param_hint="--model")
        tcfg = SimConfig(prof, names, None, speedup, seed, faults)
        triton.run(tcfg, host=host, port=port, metrics_port=metrics_port, log_level=log_level)
        return
    cfg = SimConfig(prof, list(model or []), api_key, speedup, seed, faults)
    uvicorn.run(
        create_app(cfg),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=1,
    )


@app.command()
def hf(
    model: Annotated[
        str | None,
        typer.Option(help="Checkpoint (Hugging Face id or path); omit with --random-weights."),
    ] = None,
    random_weights: Annotated[
        bool, typer.Option(help="Llama-2-7B's architecture with random weights (no download).")
    ] = False,
    attn: Annotated[
        str,
        typer.Option(help="Attention: eager (the tutorial's v0), sdpa or flash_attention_2 (v1)."),
    ] = "sdpa",
    served_model_name: Annotated[
        str, typer.Option(help="The model name clients send.")
    ] = "meta-llama/Llama-2-7b-chat-hf",
    device: Annotated[str, typer.Option(help="torch device.")] = "cuda",
    max_model_len: Annotated[int, typer.Option(min=2, help="Context length.")] = 4096,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "warning",
) -> None:
    """Run the tutorial's v0/v1: transformers `generate`, one request at a time, behind vLLM's
    OpenAI API and metric names (needs the `hf` extra: torch and transformers)."""
    if (model is None) == (not random_weights):
        raise typer.BadParameter("give --model or --random-weights (one of them)")
    import uvicorn

    from engines.hf.model import TransformersGenerator
    from engines.hf.server import HFConfig, create_app

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        typer.echo(f"tiergate hf: {e.name} is not installed: it needs the `hf` extra "
                   "(.venv/bin/uv sync --inexact --extra hf, or pip install 'tiergate[hf]')",
                   err=True)  # fmt: skip
        raise typer.Exit(2) from None
    gen = TransformersGenerator(model, attn=attn, device=device, max_model_len=max_model_len)
    app_ = create_app(HFConfig(gen, served_model_name, attn))
    uvicorn.run(app_, host=host, port=port, log_level=log_level, access_log=False)


# The model name of engines/triton/model_repository (the tutorial's v5 step).
TRITON_MODEL = "llama31-8b-awq"


def _serve(settings: object, banner: Callable[[], None] | None = None) -> None:
    """Run the gateway in the foreground; call `banner` once it answers /ready."""
    import asyncio

    import uvicorn

    from gateway.app import create_app
    from gateway.settings import Settings

    assert isinstance(settings, Settings)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn has no event)
            await asyncio.sleep(0.05)
        if banner is not None and server.started:
            await asyncio.to_thread(_wait_ready, settings.port)
            banner()
        await task

    import gc

    import uvloop

    # Objects alive after start-up live for the whole process: keep them out of the collector's
    # full passes, which otherwise showed up as 30-90 ms stalls in the latency tail.
    gc.collect()
    gc.freeze()
    uvloop.run(main())
    if not server.started:
        raise typer.Exit(1)


def _wait_ready(port: int) -> None:
    from engines.sim.launch import wait_http

    try:
        wait_http(f"http://127.0.0.1:{port}/ready", timeout=10)
    except TimeoutError:
        logging.getLogger("tiergate").warning("gateway not ready yet: see /ready")


@app.command()
def serve(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML file with tiers and policy (TIERGATE_CONFIG).",
            envvar="TIERGATE_CONFIG",
        ),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 0.0.0.0).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000).")] = None,
    log_level: Annotated[str | None, typer.Option(help="Logging level.")] = None,
) -> None:
    """Run the gateway alone, in front of the engines a config file names (real vLLM, Triton
    or simulators). Environment variables TIERGATE_* override the file."""
    from gateway.settings import ConfigError, load_settings
    from gateway.telemetry import setup_logging

    overrides = {
        k: v
        for k, v in {"host": host, "port": port, "log_level": log_level}.items()
        if v is not None
    }
    try:
        settings = load_settings(config, **overrides)
    except ConfigError as e:
        typer.echo(f"tiergate: invalid configuration: {e}", err=True)
        raise typer.Exit(2) from None
    setup_logging(settings.log_level, settings.log_json)
    _serve(settings)


@app.command()
def up(
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000,
    latency: Annotated[int, typer.Option(help="Latency-tier simulators (v4 profile).")] = 1,
    throughput: Annotated[int, typer.Option(help="Throughput-pool simulators (v3).")] = 2,
    latency_profile: Annotated[str, typer.Option(help="Profile of the latency tier.")] = "v4",
    throughput_profile: Annotated[str, typer.Option(help="Profile of the throughput pool.")] = "v3",
    sim_port: Annotated[int, typer.Option(help="First simulator port.")] = 8201,
    policy: Annotated[str, typer.Option(help="Routing policy.")] = "golden-range",
    speedup: Annotated[float, typer.Option(help="Run the simulators N times faster.")] = 1.0,
    redis_url: Annotated[
        str | None, typer.Option(envvar="TIERGATE_REDIS_URL", help="Share in-flight state.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Gateway logging level.")] = "info",
    logs: Annotated[Path, typer.Option(help="Folder for the simulators' logs.")] = Path(
        ".tiergate"
    ),
) -> None:
    """Start the embedded stack: simulated engines (a latency tier and a throughput pool)
    and the gateway in front of them. Ctrl-C stops everything."""
    from rich.console import Console
    from rich.panel import Panel

    from engines.sim.launch import SimProcess
    from engines.sim.profile import load_profile
    from gateway.settings import ConfigError, load_settings
    from gateway.telemetry import setup_logging

    console = Console(stderr=True)
    setup_logging(log_level, False)
    logs.mkdir(parents=True, exist_ok=True)
    model = load_profile(throughput_profile).model
    extra = ["--speedup", str(speedup)] if speedup != 1 else []
    plan = [("latency", latency_profile)] * latency + [
        ("throughput", throughput_profile)
    ] * throughput
    sims: list[tuple[str, SimProcess]] = []
    try:
        with console.status("starting simulated engines..."):
            for i, (role, prof) in enumerate(plan):
                sim = SimProcess(
                    port=sim_port + i,
                    profile=prof,
                    args=["--model", model, *extra],
                    log=logs / f"sim-{sim_port + i}.log",
                )
                sims.append((role, sim.start()))
        tiers = [
            {
                "name": role,
                "role": role,
                "backends": [{"url": s.url, "models": [model]} for r, s in sims if r == role],
            }
            for role in ("latency", "throughput")
            if any(r == role for r, _ in sims)
        ]
        try:
            settings = load_settings(
                None,
                tiers=tiers,
                port=port,
                log_level=log_level,
                policy={"name": policy},
                redis_url=redis_url,
            )
        except ConfigError as e:
            typer.echo(f"tiergate: invalid configuration: {e}", err=True)
            raise typer.Exit(2) from None

        def banner() -> None:
            lines = [f"[bold]gateway[/]    http://127.0.0.1:{port}/v1  (metrics: /metrics)"]
            for role, s in sims:
                lines.append(f"[bold]{role:<11}[/]{s.url}  ({s.profile})")
            lines += [
                "",
                "try:",
                f"  curl -s http://127.0.0.1:{port}/v1/completions \\",
                "    -H 'Content-Type: application/json' \\",
                f'    -d \'{{"model": "{model}", "prompt": "Hello", "max_tokens": 32}}\' -i',
                "",
                "Ctrl-C stops everything.",
            ]
            console.print(Panel("\n".join(lines), title="tiergate is up", expand=False))

        _serve(settings, banner)
    finally:
        for _, s in sims:
            s.stop()


@bench.command("calibrate")
def bench_calibrate(
    profiles: Annotated[
        list[str] | None, typer.Option("--profile", help="Profiles to run (default: all).")
    ] = None,
    requests_per_user: Annotated[
        int | None,
        typer.Option(
            help="Closed-loop requests per user, the first being warm-up (default: targets.yaml)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the cells as JSON here.")] = None,
    report: Annotated[
        Path | None, typer.Option(help="Also write the printed tables as markdown here.")
    ] = None,
) -> None:
    """Drive each simulator profile at the tutorial's concurrencies over HTTP and compare every
    cell with the table: target, measured, ratio."""
    from loadtests.calibrate import run

    _logging("warning")
    run(profiles or None, requests_per_user=requests_per_user, out=out, report=report)


@bench.command("routing")
def bench_routing(
    phase_seconds: Annotated[float, typer.Option(help="Seconds per phase of each shape.")] = 15,
    rounds: Annotated[int, typer.Option(help="Rounds (the policy order rotates each round).")] = 1,
    shape: Annotated[
        list[str] | None, typer.Option(help="Shapes to run: step, burst (default both).")
    ] = None,
    policy: Annotated[
        list[str] | None, typer.Option(help="Policies to compare (default all five).")
    ] = None,
    speedup: Annotated[float, typer.Option(help="Run the engines N times faster.")] = 1.0,
    slo_ttft: Annotated[float, typer.Option(help="TTFT SLO, seconds.")] = 1.0,
    slo_tpot: Annotated[float, typer.Option(help="TPOT SLO, seconds.")] = 0.025,
    out: Annotated[Path, typer.Option(help="Folder for routing.md/.json/.png.")] = Path(
        "docs/results"
    ),
) -> None:
    """Compare the routing policies on one simulated deployment (1 x v4 latency + 2 x v3
    throughput): step and burst shapes, per phase TTFT/TPOT p50/p99, tok/s and goodput."""
    from loadtests.phases import Slo
    from loadtests.routing import POLICIES, run

    _logging("warning")
    run(
        shapes=tuple(shape or ("step", "burst")),
        policies=tuple(policy or POLICIES),
        phase_s=phase_seconds,
        rounds=rounds,
        speedup=speedup,
        slo=Slo(slo_ttft, slo_tpot),
        out_dir=out,
    )


@bench.command("overhead")
def bench_overhead(
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
) -> None:
    """The gateway's own cost: added latency, added TTFT and throughput of one gateway worker,
    against the same instant simulator called directly and through nginx (the floor)."""
    from loadtests.overhead import Options, run

    _logging("warning")
    run(Options(duration_s=duration, rounds=rounds, rate=rate, wrk_seconds=wrk_seconds, out=out))


@bench.command("triton")
def bench_triton(
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
    from loadtests.tritonbench import Options, run

    _logging("warning")
    run(Options(duration_s=duration, rounds=rounds, rate=rate, stream_tokens=stream_tokens,
                out=out))  # fmt: skip


@bench.command("clients")
def bench_clients(
    requests: Annotated[int, typer.Option(min=1, help="Requests per library per round.")] = 3000,
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrent requests.")] = 64,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (libraries alternating).")] = 3,
    out: Annotated[Path, typer.Option(help="Markdown summary.")] = Path("docs/results/clients.md"),
) -> None:
    """httpx against aiohttp as the upstream client: requests/s and client CPU per request, on
    the same small requests to an instant simulator (why the gateway uses aiohttp)."""
    from loadtests.clients import run

    _logging("warning")
    run(requests=requests, concurrency=concurrency, rounds=rounds, out=out)


@bench.command("tables")
def bench_tables(
    version: Annotated[
        list[str] | None, typer.Option(help="Versions to run (v0..v4; default all).")
    ] = None,
    v5: Annotated[bool, typer.Option(help="Also run the v5 cluster rows.")] = True,
    v5_instances: Annotated[
        list[int] | None, typer.Option(help="Cluster sizes for v5 (default 1, 3, 6).")
    ] = None,
    v5_seconds: Annotated[float, typer.Option(help="Seconds per v5 run.")] = 20.0,
    requests_per_user: Annotated[
        int | None, typer.Option(help="Closed-loop requests per user (first is warm-up).")
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for tables.md/.json and the plots.")] = Path(
        "docs/results"
    ),
) -> None:
    """Reproduce the tutorial's tables (v0..v4, and v5's cluster rows) through the gateway
    against the simulator profiles; report tutorial vs measured cell by cell, with plots."""
    from rich.console import Console

    from loadtests.tables import print_summary, run

    _logging("warning")
    console = Console()
    report = run(
        version or None,
        out_dir=out,
        v5=v5,
        v5_instances=tuple(v5_instances or (1, 3, 6)),
        v5_seconds=v5_seconds,
        requests_per_user=requests_per_user,
        console=console,
    )
    if report["v5"]:
        print_summary(report, console)


@bench.command("dashboards")
def bench_dashboards(
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

    from loadtests.dashboards import run

    _logging("warning")
    run(out, seconds=seconds, speedup=speedup, output_tokens=output_tokens, step=step,
        rate_interval=rate_interval, console=Console())  # fmt: skip


def main() -> None:
    app()


if __name__ == "__main__":
    main()
