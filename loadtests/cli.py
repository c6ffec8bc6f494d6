"""`tiergate bench`: the benchmarks, each a command that imports its module when it runs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from gateway.routing import POLICY_NAMES

bench = typer.Typer(help="Benchmarks (each prints its measurements and their sample counts).")


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _policies(names: list[str] | None) -> list[str] | None:
    unknown = [n for n in names or () if n not in POLICY_NAMES]
    if unknown:
        choices = ", ".join(POLICY_NAMES)
        raise typer.BadParameter(f"unknown {', '.join(unknown)}; choose from {choices}")
    return names


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
        list[str] | None,
        typer.Option(
            callback=_policies,
            help=f"Policies to compare (default all: {', '.join(POLICY_NAMES)}).",
        ),
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
    from loadtests.overhead import Options, run

    _logging("warning")
    run(Options(duration_s=duration, rounds=rounds, rate=rate, wrk_seconds=wrk_seconds, out=out,
                baseline=baseline))  # fmt: skip


@bench.command("instructions")
def bench_instructions(
    baseline: Annotated[
        str, typer.Option("--baseline", metavar="REF", help="Git ref whose gateway is compared.")
    ] = "HEAD",
    requests: Annotated[
        int, typer.Option(min=1, help="Counted requests per kind and round.")
    ] = 400,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (a fresh process each).")] = 2,
    out: Annotated[Path, typer.Option(help="JSON results; the .md is written next to it.")] = Path(
        "docs/results/instructions.json"
    ),
) -> None:
    """The gateway's CPU per request as instructions counted by valgrind's callgrind (exact
    where timings drift), against the gateway of another commit: small requests and streams."""
    from loadtests.instructions import Options, run

    _logging("warning")
    run(Options(baseline=baseline, requests=requests, rounds=rounds, out=out))


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
