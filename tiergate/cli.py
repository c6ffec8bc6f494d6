"""The `tiergate` command line: each layer's commands in one app. The layers' modules import
only typer at the top, so `tiergate sim` loads neither the gateway nor the benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engines import cli as engines_cli
from gateway.serve import cli as gateway_cli
from loadtests import cli as loadtests_cli
from tiergate.up import up

app = typer.Typer(
    help="tiergate: an OpenAI-compatible gateway that puts each request on the LLM serving tier "
    "that answers it best right now.",
    no_args_is_help=True,
    add_completion=False,
)
app.command()(engines_cli.sim)
app.command()(engines_cli.hf)
app.command()(gateway_cli.serve)
app.command()(up)


def study_command(
    phase_seconds: Annotated[
        float, typer.Option(help="Virtual seconds per phase of each shape.")
    ] = 20.0,
    seeds: Annotated[int, typer.Option(help="Seeds per cell and policy.")] = 6,
    deployment: Annotated[
        list[str] | None,
        typer.Option(
            help="Deployments (loadtests/deployments.py): little, tutorial, a-lot, "
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
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for routing-sim.md/.json/.png and the learned-* plots."),
    ] = None,
) -> None:
    """The routing policies on a virtual clock: the gateway's policies and latency model
    driving the simulator's scheduler, over deployments x shapes x SLO classes x seeds, with
    the oracle's sweep of latency-tier limits."""
    from loadtests.phases import SHAPES
    from tiergate import study

    def pick(names: list[str] | None, known: tuple[str, ...], what: str) -> tuple[str, ...]:
        unknown = [n for n in names or () if n not in known]
        if unknown:
            raise typer.BadParameter(
                f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}"
            )
        return tuple(names) if names else known

    opts = study.Options(
        phase_s=phase_seconds,
        seeds=seeds,
        deployments=pick(deployment, tuple(study.DEPLOYMENTS), "deployment"),
        shapes=pick(shape, tuple(SHAPES), "shape"),
        slos=pick(slo, tuple(study.SLO_CLASSES), "SLO class"),
        jobs=jobs,
        out=out,
        decision_calls=decision_calls,
    )
    study.run(opts)


loadtests_cli.bench.command("routing-sim")(study_command)


def decision_cost_command(
    runs: Annotated[int, typer.Option(min=1, help="Whole measurements, one after another.")] = 3,
    calls: Annotated[
        int,
        typer.Option(
            min=5,
            help="Calls per run, policy and snapshot size (3 and 16 backends), over 5 rounds.",
        ),
    ] = 100_000,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="Policies to time (default: learned, golden-range, least-loaded, power-of-two)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for decision-cost.md/.json.")] = None,
) -> None:
    """The CPU cost of one routing decision alone, per policy, with 3 and 16 backends: each
    policy called in a loop on a fixed snapshot, `runs` times over; medians and every run's
    p50/p99, against the goals (learned: p99 <= 20 µs with 3 backends, <= 40 µs with 16)."""
    import json

    from rich.console import Console
    from rich.progress import Progress

    from gateway.routing import POLICY_NAMES
    from loadtests.overhead import run_header
    from tiergate import decision_cost
    from tiergate.study import revision

    names = tuple(policy or ("learned", "golden-range", "least-loaded", "power-of-two"))
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICY_NAMES)}"
        )
    if "learned" not in names:
        names = ("learned", *names)  # the goals are the learned policy's
    console = Console()
    with Progress(console=console) as bar:
        task = bar.add_task("timing decisions", total=runs)
        report = decision_cost.repeated(
            names, runs, max(1, calls // 5), lambda done: bar.update(task, completed=done)
        )
    options = {"runs": runs, "calls": calls, "policy": list(names)}
    flags = f"--runs {runs} --calls {calls}" + "".join(f" --policy {n}" for n in names)
    header = run_header(f"tiergate bench decision-cost {flags}", options, ())
    report = {**header, "revision": revision(), **report}
    text = decision_cost.markdown(report)
    console.print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "decision-cost.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "decision-cost.md").write_text(text)
        console.print(f"wrote decision-cost.md/.json to {out}")


loadtests_cli.bench.command("decision-cost")(decision_cost_command)
app.add_typer(loadtests_cli.bench, name="bench")
app.add_typer(gateway_cli.keys, name="keys")


def main() -> None:
    app()
