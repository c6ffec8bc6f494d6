"""`tiergate bench autoscale`: the planner against the HPAs on a virtual clock (study.py), an
elastic deployment of simulated engines behind the gateway's own routing and planner
(cosim.py), scaled by Kubernetes' HPA controller (hpa.py) fed each arm's metric (arms.py),
under open-loop traces (traces.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def command(
    deployment: Annotated[
        list[str] | None,
        typer.Option(
            help="Deployments: tutorial (A100 engines), tutorial-rare (the same, 2% interactive), "
            "knee-64 (H200-like) (default: tutorial)."
        ),
    ] = None,
    trace: Annotated[
        list[str] | None, typer.Option(help="Traces: diurnal, flash, shift (default all).")
    ] = None,
    arm: Annotated[
        list[str] | None,
        typer.Option(help="Autoscalers: tutorial-hpa, queue-hpa, planner (default all)."),
    ] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per trace and arm.")] = 3,
    time_scale: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="Every trace's length times this (1: a 2-hour day, "
            "40-minute flash and shift traces).",
        ),
    ] = 1.0,
    headroom: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="The planner's spare capacity over its forecast (planner.headroom; default: "
            "the setting's default).",
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(help="Worker processes (0: one per CPU).")] = 0,
    out: Annotated[Path | None, typer.Option(help="Folder for autoscale.md/.json/.png.")] = None,
) -> None:
    """Autoscalers on a virtual clock: the tutorial's HPA thresholds, an HPA on queue depth and
    the gateway's planner scaling an elastic deployment (replicas that take 30-120 s to start)
    through day-long, flash-crowd and workload-shift traces; SLO attainment per class,
    GPU-hours and replica timelines."""
    from loadtests.autoscale import study
    from loadtests.autoscale.arms import ARMS
    from loadtests.autoscale.traces import TRACES
    from loadtests.common.options import pick

    study.run(study.Options(
        deployments=pick(deployment, tuple(study.DEPLOYMENTS), "deployment")
        if deployment else study.Options().deployments,
        traces=pick(trace, tuple(TRACES), "trace"),
        arms=pick(arm, tuple(ARMS), "arm"),
        seeds=seeds, time_scale=time_scale, headroom=headroom, jobs=jobs, out=out,
    ))  # fmt: skip
