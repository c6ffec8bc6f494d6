"""`tiergate up`: simulated engines (a latency tier and a throughput pool) started as processes,
and the gateway in front of them in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.routing import DEFAULT_POLICY, PolicyName


def up(
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000,
    latency: Annotated[int, typer.Option(help="Latency-tier simulators (v4 profile).")] = 1,
    throughput: Annotated[int, typer.Option(help="Throughput-pool simulators (v3).")] = 2,
    latency_profile: Annotated[str, typer.Option(help="Profile of the latency tier.")] = "v4",
    throughput_profile: Annotated[str, typer.Option(help="Profile of the throughput pool.")] = "v3",
    sim_port: Annotated[int, typer.Option(help="First simulator port.")] = 8201,
    policy: Annotated[PolicyName, typer.Option(help="Routing policy.")] = DEFAULT_POLICY,
    speedup: Annotated[float, typer.Option(help="Run the simulators N times faster.")] = 1.0,
    prefix_caching: Annotated[
        bool,
        typer.Option(
            "--prefix-caching/--no-prefix-caching",
            help="The simulators' automatic prefix caching (on, as in vLLM).",
        ),
    ] = True,
    redis_url: Annotated[
        str | None, typer.Option(envvar="TIERGATE_REDIS_URL", help="Share in-flight state.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Gateway logging level.")] = "info",
    workers: Annotated[
        int, typer.Option(help="Gateway processes on the port, sharing in-flight counts.")
    ] = 1,
    logs: Annotated[Path, typer.Option(help="Folder for the simulators' logs.")] = Path(
        ".tiergate"
    ),
    tenants: Annotated[
        Path | None,
        typer.Option(
            help="A tenants file (named keys with priorities and limits), e.g. "
            "examples/tenants.yaml: the gateway then asks every request for a key.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
) -> None:
    """Start the embedded stack: simulated engines (a latency tier and a throughput pool)
    and the gateway in front of them. Ctrl-C stops everything."""
    from rich.console import Console
    from rich.panel import Panel

    from engines.sim.profile import load_profile
    from gateway.config.settings import ConfigError, load_settings
    from gateway.observe.telemetry import setup_logging
    from gateway.serve.cli import run
    from loadtests.harness.procs import SimProcess

    console = Console(stderr=True)
    setup_logging(log_level, False)
    logs.mkdir(parents=True, exist_ok=True)
    model = load_profile(throughput_profile).model
    extra = ["--speedup", str(speedup)] if speedup != 1 else []
    extra.append("--prefix-caching" if prefix_caching else "--no-prefix-caching")
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
                workers=workers,
                tenants_file=tenants,
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
                *([f"    -H 'Authorization: Bearer <a key of {tenants}>' \\"] if tenants else []),
                f'    -d \'{{"model": "{model}", "prompt": "Hello", "max_tokens": 32}}\' -i',
                "",
                "Ctrl-C stops everything.",
            ]
            console.print(Panel("\n".join(lines), title="tiergate is up", expand=False))

        run(settings, banner)
    finally:
        for _, s in sims:
            s.stop()
