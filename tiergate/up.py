"""`tiergate up`: simulated engines (a latency tier and a throughput pool) started as processes,
and the gateway in front of them in this process."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.routing import DEFAULT_POLICY, PolicyName

if TYPE_CHECKING:
    from loadtests.harness.procs import SimProcess
    from tiergate.autoscale import PoolScaler


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
    autoscale: Annotated[
        bool,
        typer.Option(
            help="Start and stop throughput simulators to follow the gateway's planner "
            "(docs/autoscaling.md): the pool is a file the gateway discovers it from; "
            "--throughput is where it starts, --max-replicas its ceiling.",
        ),
    ] = False,
    max_replicas: Annotated[
        int, typer.Option(min=1, help="--autoscale: the most throughput simulators.")
    ] = 6,
    startup_s: Annotated[
        float,
        typer.Option(
            min=0, help="--autoscale: a new simulator's start-up (seconds before it listens)."
        ),
    ] = 10.0,
    scale_down_after_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="--autoscale: how long the plan must want fewer simulators before one leaves.",
        ),
    ] = 30.0,
) -> None:
    """Start the embedded stack: simulated engines (a latency tier and a throughput pool)
    and the gateway in front of them. Ctrl-C stops everything."""
    import threading

    from rich.console import Console
    from rich.panel import Panel

    from engines.sim.profile import load_profile
    from gateway.config.settings import ConfigError, load_settings
    from gateway.observe.telemetry import setup_logging
    from gateway.serve.cli import run
    from loadtests.harness.procs import SimProcess

    if autoscale and throughput < 1:
        raise typer.BadParameter("--autoscale needs a throughput simulator to start from",
                                 param_hint="--throughput")  # fmt: skip
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
    scaler = None
    stop = threading.Event()
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
        tiers: list[dict[str, object]] = [
            {
                "name": role,
                "role": role,
                "backends": [{"url": s.url, "models": [model]} for r, s in sims if r == role],
            }
            for role in ("latency", "throughput")
            if any(r == role for r, _ in sims)
        ]
        if autoscale:
            scaler = _scaler(port, logs, sims, (sim_port + len(plan), throughput_profile, model,
                                                [*extra, "--startup-s", str(startup_s)]),
                             startup_s, scale_down_after_s)  # fmt: skip
            tiers = _autoscaled(tiers, scaler.listing, model, max_replicas, latency)
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
            if scaler is not None:
                lines.append(f"[bold]autoscale[/]  the pool follows the planner: 1..{max_replicas}"
                             f" simulators, {startup_s:g} s to start (list: {scaler.listing})")
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

        if scaler is not None:
            threading.Thread(target=scaler.run, args=(stop,), name="autoscale", daemon=True).start()
        run(settings, banner)
    finally:
        stop.set()
        if scaler is not None:
            scaler.close()
        for _, s in sims:
            s.stop()


def _scaler(
    port: int,
    logs: Path,
    sims: list[tuple[str, SimProcess]],
    spawning: tuple[int, str, str, list[str]],
    startup_s: float,
    down_after_s: float,
) -> PoolScaler:
    """The pool's scaler, adopting the throughput simulators started already, and the file that
    lists them; `spawning`: the first port for new ones, their profile, model and arguments."""
    from loadtests.harness.procs import SimProcess, bindable
    from tiergate.autoscale import PoolScaler

    first, profile, model, args = spawning
    ports = iter(range(first, 65_536))

    def spawn() -> SimProcess:
        # The next port nothing holds now (a client's connection may have taken one since the
        # stack started: the scaler retries a simulator that could not bind, on another).
        p = next(q for q in ports if bindable(q))
        return SimProcess(port=p, profile=profile, args=["--model", model, *args],
                          log=logs / f"sim-{p}.log")  # fmt: skip

    scaler = PoolScaler(f"http://127.0.0.1:{port}", "throughput", logs / "pool.yaml", spawn,
                        startup_s, down_after_s=down_after_s)  # fmt: skip
    for role, s in sims:
        if role == "throughput":
            scaler.adopt(s)
    scaler.write()
    return scaler


def _autoscaled(
    tiers: list[dict[str, object]], listing: Path, model: str, maximum: int, latency: int
) -> list[dict[str, object]]:
    """The tiers with the pool discovered from `listing`, within 1..`maximum` replicas, and the
    latency tier held at its `latency` simulators (only the pool is scaled)."""
    out = []
    for t in tiers:
        if t["role"] == "throughput":
            t = {"name": t["name"], "role": "throughput",
                 "discovery": {"file": {"path": str(listing), "interval_s": 0.5},
                               "backend": {"models": [model]}},
                 "replicas": {"minimum": 1, "maximum": maximum}}  # fmt: skip
        else:
            t = {**t, "replicas": {"minimum": latency, "maximum": latency}}
        out.append(t)
    return out
