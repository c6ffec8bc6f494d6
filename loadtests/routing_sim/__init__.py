"""`tiergate bench routing-sim`: the routing study on a virtual clock (study.py), the gateway's
own routing parts driving the simulator's scheduler in one process (cosim.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def command(
    phase_seconds: Annotated[
        float, typer.Option(help="Virtual seconds per phase of each shape.")
    ] = 20.0,
    seeds: Annotated[int, typer.Option(help="Seeds per cell and policy.")] = 6,
    deployment: Annotated[
        list[str] | None,
        typer.Option(
            help="Deployments (loadtests/harness/deployments.py): little, tutorial, a-lot, "
            "shift, knee-32, knee-48, knee-64, knee-96, eagle-worse, two-latency, "
            "unlike-pool (default all)."
        ),
    ] = None,
    shape: Annotated[
        list[str] | None, typer.Option(help="Shapes: step, burst (default both).")
    ] = None,
    slo: Annotated[
        list[str] | None,
        typer.Option(
            help="SLO classes: tight, interactive, standard (default: each deployment's own two)."
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(help="Worker processes (0: one per CPU).")] = 0,
    decision_calls: Annotated[
        int,
        typer.Option(
            min=5,
            help="Calls per policy and snapshot size (3 and 16 backends) "
            "that time one routing decision alone.",
        ),
    ] = 100_000,
    workload: Annotated[
        str,
        typer.Option(
            help="one-off: every request a prompt of its own; chat: conversations of 4 turns "
            "sharing a 600-token system prompt, each turn resending the history (prefix "
            "caching and affinity at work)."
        ),
    ] = "one-off",
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for routing-sim.md/.json/.png and the learned-* plots."),
    ] = None,
) -> None:
    """The routing policies on a virtual clock: the gateway's policies and latency model
    driving the simulator's scheduler, over deployments x shapes x SLO classes x seeds, with
    the oracle's sweep of latency-tier limits."""
    from loadtests.common.options import pick
    from loadtests.harness.phases import SHAPES
    from loadtests.routing_sim import study

    if workload not in study.WORKLOADS:
        raise typer.BadParameter(f"unknown workload {workload}; choose from one-off, chat")
    opts = study.Options(
        phase_s=phase_seconds,
        seeds=seeds,
        deployments=pick(deployment, tuple(study.DEPLOYMENTS), "deployment"),
        shapes=pick(shape, tuple(SHAPES), "shape"),
        slos=pick(slo, tuple(study.SLO_CLASSES), "SLO class"),
        jobs=jobs,
        out=out,
        decision_calls=decision_calls,
        workload=workload,
    )
    study.run(opts)
