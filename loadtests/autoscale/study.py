"""`tiergate bench autoscale`: the autoscalers (arms.py) over traces (traces.py) and seeds, each
run an elastic deployment on a virtual clock (cosim.py); SLO attainment per class, GPU-hours
and replica timelines.

Before the runs, one pool replica's QPS ceiling is measured on the same virtual clock by a load
test (`ceiling`): the traces' unit, and the tutorial HPA's requests/s target (70% of it), as
the tutorial sets it.
Every arm of a seed meets the same arrivals. The runs go to a process pool in an order rotated
per seed (on a virtual clock the order changes nothing measured; only the wall time is shared).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engines.sim.profile import load_profile
from gateway.config.settings import PlannerConfig
from gateway.routing import Slo
from loadtests.autoscale.arms import ARMS
from loadtests.autoscale.cosim import STARTUP_S, TIERS, Run, Spec, simulate
from loadtests.autoscale.traces import TRACES, Klass
from loadtests.common.report import markdown_table, print_tables, revision
from loadtests.common.stats import median, rotation
from loadtests.routing_sim.cosim import RunSpec
from loadtests.routing_sim.cosim import simulate as closed_loop

__all__ = ["DEPLOYMENTS", "Options", "run"]

CODE: Final = ("gateway", "engines", "loadtests/autoscale", "loadtests/routing_sim/cosim.py")
ATTAINED: Final = 0.9
CEILING_S: Final = 60.0
MINUTE: Final = 60.0
GOAL_GPU_SAVING: Final = 0.20
GOAL_FLASH: Final = 0.95


@dataclass(frozen=True, slots=True)
class Deployment:
    latency: str
    throughput: str
    classes: tuple[Klass, ...]
    shifted: str  # the latency engine's profile whose acceptance the shift brings
    about: str


DEPLOYMENTS: Final = {
    "tutorial": Deployment(
        "v4", "v3",
        (Klass("interactive", 1.0, 0.012, 0.25, 128, 512),
         Klass("standard", 1.0, 0.025, 0.75, 128, 512)),
        "v4-low", "A100 (the tutorial's engines): EAGLE v4 (3.26 tokens per step), AWQ v3 pool",
    ),
    # The same engines, the interactive class rare: often none of it in flight.
    "tutorial-rare": Deployment(
        "v4", "v3",
        (Klass("interactive", 1.0, 0.012, 0.02, 128, 512),
         Klass("standard", 1.0, 0.025, 0.98, 128, 512)),
        "v4-low", "A100 (the tutorial's engines), 2% of the requests in the interactive class",
    ),
    "knee-64": Deployment(
        "h200-eagle-a31", "h200-awq",
        (Klass("tight", 1.0, 0.004, 0.25, 128, 512),
         Klass("standard", 1.0, 0.025, 0.75, 128, 512)),
        "h200-eagle-a13", "H200-like: EAGLE (3.1, as fast per token as AWQ at ~64 streams), AWQ",
    ),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Options:
    deployments: tuple[str, ...] = ("tutorial",)
    traces: tuple[str, ...] = tuple(TRACES)
    arms: tuple[str, ...] = tuple(ARMS)
    seeds: int = 3
    # Scales every trace's length (the diurnal day is 2 h of virtual time at 1).
    time_scale: float = 1.0
    headroom: float | None = None  # the planner's (None: PlannerConfig's default)
    jobs: int = 0
    out: Path | None = None

    def command(self) -> str:
        default = Options()
        args = ["tiergate bench autoscale"]
        for flag, mine, every in (("--deployment", self.deployments, default.deployments),
                                  ("--trace", self.traces, default.traces),
                                  ("--arm", self.arms, default.arms)):  # fmt: skip
            if mine != every:
                args += [f"{flag} {x}" for x in mine]
        if self.seeds != default.seeds:
            args.append(f"--seeds {self.seeds}")
        if self.time_scale != default.time_scale:
            args.append(f"--time-scale {self.time_scale:g}")
        if self.headroom is not None:
            args.append(f"--headroom {self.headroom:g}")
        if self.out is not None:
            args.append(f"--out {self.out if not self.out.is_absolute() else 'DIR'}")
        return " ".join(args)


def ceiling(d: Deployment) -> float:
    """One pool replica's QPS ceiling, measured as the tutorial says (a load test): closed-loop
    users doubling from 8 up to the engine's batch limit, each level CEILING_S virtual seconds
    of the traces' usual request (the first class's answer length); the most completions per
    second of a level where >= 90% of the requests met the loosest class's SLO."""
    loose = max(d.classes, key=lambda c: c.tpot_s)
    best, users = 0.0, 8
    while users <= load_profile(d.throughput).max_num_seqs:
        spec = RunSpec(latency=(), throughput=(d.throughput,), users=(users,),
                       phase_s=CEILING_S, slo=Slo(loose.ttft_s, loose.tpot_s),
                       policy="least-loaded", prompt_tokens=128,
                       output_tokens=d.classes[0].output_tokens)  # fmt: skip
        done = [x for x in closed_loop(spec).done if x.phase is not None]
        if not done or sum(x.met for x in done) < ATTAINED * len(done):
            break
        best = max(best, len(done) / CEILING_S)
        users *= 2
    return best


@dataclass(frozen=True, slots=True)
class Task:
    deployment: str
    trace: str
    arm: str
    seed: int
    spec: Spec


@dataclass(slots=True)
class Summary:
    """What the report needs of one run (computed in the worker)."""

    served: list[int]  # per class
    met: list[int]
    flash_served: list[int]  # arrived during the flash crowd (flash trace)
    flash_met: list[int]
    minutes: list[float]  # SLO attainment of the requests arrived in each minute
    gpu_h: list[float]  # per tier
    timeline: list[tuple[float, int, int, int, int]]  # t, asked L/T, serving L/T
    unfinished: int
    wall_s: float
    by_tier: dict[str, int] = field(default_factory=dict)


def summarize(run: Run) -> Summary:
    n = len(run.spec.classes)
    served, met = [0] * n, [0] * n
    fs, fm = [0] * n, [0] * n
    trace = run.spec.trace
    flash = (trace.flash[0], trace.flash[2]) if trace.kind == "flash" else None
    buckets = max(1, math.ceil(trace.duration_s / MINUTE))
    mins = [[0, 0] for _ in range(buckets)]
    by_tier: dict[str, int] = {}
    for s in run.served:
        served[s.klass] += 1
        met[s.klass] += s.met
        b = mins[min(buckets - 1, int(s.arrived // MINUTE))]
        b[0] += 1
        b[1] += s.met
        by_tier[s.tier] = by_tier.get(s.tier, 0) + 1
        if flash is not None and flash[0] <= s.arrived < flash[1]:
            fs[s.klass] += 1
            fm[s.klass] += s.met
    return Summary(
        served, met, fs, fm, [m / a if a else math.nan for a, m in mins],
        [g / 3600 for g in run.gpu_s],
        [(t, a[0], a[1], r[0], r[1]) for t, a, r in run.timeline],
        run.unfinished, run.wall_s, by_tier,
    )  # fmt: skip


def _work(task: Task) -> tuple[Task, Summary]:
    return task, summarize(simulate(task.spec, ARMS[task.arm]))


def tasks(opts: Options, ceilings: dict[str, float]) -> list[Task]:
    out = []
    # As docs/autoscaling.md says to set it: the longest start-up of a replica.
    given = {} if opts.headroom is None else {"headroom": opts.headroom}
    planner = PlannerConfig.model_validate({"startup_s": STARTUP_S[1], **given})
    for dep in opts.deployments:
        d = DEPLOYMENTS[dep]
        shifted = load_profile(d.shifted).speculative
        for seed in range(opts.seeds):
            for trace in opts.traces:
                base = TRACES[trace]
                tr = replace(base, duration_s=base.duration_s * opts.time_scale)
                for arm in rotation(opts.arms, seed):
                    spec = Spec(d.latency, d.throughput, d.classes, tr, ceilings[dep], arm,
                                seed=seed,
                                shifted_acceptance=None if shifted is None else shifted.acceptance,
                                planner=planner)  # fmt: skip
                    out.append(Task(dep, trace, arm, seed, spec))
    return out


def run(opts: Options, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    code = revision(CODE)
    t0 = time.perf_counter()
    ceilings = {d: ceiling(DEPLOYMENTS[d]) for d in opts.deployments}
    for d, c in ceilings.items():
        console.print(f"{d}: one pool replica's QPS ceiling {c:.2f} requests/s")
    todo = tasks(opts, ceilings)
    done: list[tuple[Task, Summary]] = []
    jobs = opts.jobs or os.cpu_count() or 1
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("autoscale runs", total=len(todo))
        if jobs == 1:
            for t in todo:
                done.append(_work(t))
                progress.advance(bar)
        else:
            # Longest runs first: the pool's tail is a short run, not a day.
            todo.sort(key=lambda t: -t.spec.trace.duration_s)
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for fut in as_completed([pool.submit(_work, t) for t in todo]):
                    done.append(fut.result())
                    progress.advance(bar)
    report = build(opts, done, ceilings, time.perf_counter() - t0, code)
    print_report(console, report)
    if opts.out is not None:
        write(opts.out, report)
        console.print(f"wrote autoscale.md/.json/.png to {opts.out}")
    return report


# -- the report ------------------------------------------------------------------------------
def _share(met: Sequence[int], served: Sequence[int]) -> float:
    n = sum(served)
    return sum(met) / n if n else math.nan


def build(
    opts: Options, done: Sequence[tuple[Task, Summary]], ceilings: dict[str, float],
    wall: float, code: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    cells: dict[str, dict[str, Any]] = {}
    for task, s in sorted(done, key=lambda d: (d[0].deployment, d[0].trace, d[0].arm,
                                                d[0].seed)):  # fmt: skip
        cell = cells.setdefault(f"{task.deployment}/{task.trace}", {
            "deployment": task.deployment, "trace": task.trace,
            "classes": [k.name for k in task.spec.classes],
            "duration_s": task.spec.trace.duration_s, "arms": {}})  # fmt: skip
        arm = cell["arms"].setdefault(task.arm, {"seeds": []})
        arm["seeds"].append({
            "seed": task.seed,
            "attainment": [m / n if n else math.nan for m, n in zip(s.met, s.served, strict=True)],
            "attainment_all": _share(s.met, s.served),
            "served": s.served,
            "flash_attainment": [m / n if n else math.nan
                                 for m, n in zip(s.flash_met, s.flash_served, strict=True)],
            "flash_served": s.flash_served,
            "gpu_h": s.gpu_h, "gpu_h_total": sum(s.gpu_h),
            "worst_minute": min((m for m in s.minutes if not math.isnan(m)), default=math.nan),
            "minutes": s.minutes, "timeline": s.timeline, "by_tier": s.by_tier,
            "unfinished": s.unfinished, "wall_s": s.wall_s,
        })  # fmt: skip
    for cell in cells.values():
        k = len(cell["classes"])
        for arm in cell["arms"].values():
            seeds = arm["seeds"]
            arm["median"] = {
                "gpu_h_total": median([x["gpu_h_total"] for x in seeds]),
                "gpu_h": [median([x["gpu_h"][i] for x in seeds]) for i in range(len(TIERS))],
                "attainment": [median([x["attainment"][i] for x in seeds]) for i in range(k)],
                "flash_attainment": [median([x["flash_attainment"][i] for x in seeds])
                                     for i in range(k)],
                "worst_minute": median([x["worst_minute"] for x in seeds]),
            }  # fmt: skip
    report: dict[str, Any] = {
        "command": opts.command(), "code": code, "wall_s": wall, "nproc": os.cpu_count(),
        "ceilings": ceilings, "cells": cells, "time_scale": opts.time_scale,
        "deployments": {d: DEPLOYMENTS[d].about for d in opts.deployments},
        "traces": {t: TRACES[t].about for t in opts.traces},
    }  # fmt: skip
    report["goals"] = goals(cells)
    return report


def _paired(cell: dict[str, Any], a: str, b: str, key: str) -> list[float]:
    """Per seed, `a`'s value of `key` over `b`'s."""
    sa = {x["seed"]: x[key] for x in cell["arms"][a]["seeds"]}
    sb = {x["seed"]: x[key] for x in cell["arms"][b]["seeds"]}
    return [sa[s] / sb[s] for s in sorted(sa) if s in sb and sb[s] > 0]


def _attainment_gap(cell: dict[str, Any], a: str, b: str) -> list[list[float]]:
    """Per class, per seed: `a`'s attainment minus `b`'s."""
    sa = {x["seed"]: x["attainment"] for x in cell["arms"][a]["seeds"]}
    sb = {x["seed"]: x["attainment"] for x in cell["arms"][b]["seeds"]}
    seeds = sorted(set(sa) & set(sb))
    return [[sa[s][i] - sb[s][i] for s in seeds] for i in range(len(cell["classes"]))]


def goals(cells: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's two lines, judged per deployment. Attainment 'equal or better within the
    noise': per class, the median gap no worse than minus the gap's spread over seeds."""
    out = []
    for cell in cells.values():
        arms = cell["arms"]
        if "planner" not in arms:
            continue
        name = f"{cell['deployment']}/{cell['trace']}"
        if cell["trace"] == "diurnal" and "tutorial-hpa" in arms:
            ratios = _paired(cell, "planner", "tutorial-hpa", "gpu_h_total")
            gaps = _attainment_gap(cell, "planner", "tutorial-hpa")
            held = all(median(g) >= -(max(g) - min(g)) - 1e-9 for g in gaps if g)
            saving = 1 - median(ratios)
            verdict = "MET" if saving >= GOAL_GPU_SAVING and held else "NOT MET"
            out.append({
                "goal": f"{name}: planner >= 20% fewer GPU-hours than tutorial-hpa at equal or "
                        "better attainment per class",
                "measured": f"GPU-hours x{median(ratios):.3f} (seeds "
                            + ", ".join(f"{r:.3f}" for r in ratios) + "); attainment gap per "
                            "class " + "; ".join(
                                f"{c} {median(g):+.3f} [{min(g):+.3f}, {max(g):+.3f}]"
                                for c, g in zip(cell["classes"], gaps, strict=True) if g),
                "verdict": verdict,
            })  # fmt: skip
        if cell["trace"] == "flash":
            mine = arms["planner"]["median"]["flash_attainment"]
            others = {a: v["median"]["flash_attainment"] for a, v in arms.items() if a != "planner"}
            ok = all(x >= GOAL_FLASH for x in mine)
            below = all(any(x < GOAL_FLASH for x in v) for v in others.values())
            out.append({
                "goal": f"{name}: planner >= 95% attainment per class through the flash crowd, "
                        "where the HPA arms fall below",
                "measured": "planner " + ", ".join(f"{x:.3f}" for x in mine) + "; " + "; ".join(
                    f"{a} " + ", ".join(f"{x:.3f}" for x in v) for a, v in others.items()),
                "verdict": "MET" if ok and below else "NOT MET",
            })  # fmt: skip
    return out


def _fmt(x: float, digits: int = 3) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def sections(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    for key, cell in report["cells"].items():
        classes = cell["classes"]
        head = ["arm", "GPU-h (median)", "GPU-h per seed", "latency / pool GPU-h",
                *[f"{c} attained" for c in classes], "worst minute", "requests"]  # fmt: skip
        if cell["trace"] == "flash":
            head[-1:-1] = [f"{c} in the flash" for c in classes]
        rows = []
        for arm, v in cell["arms"].items():
            m, seeds = v["median"], v["seeds"]
            row = [arm, _fmt(m["gpu_h_total"], 2),
                   " / ".join(_fmt(x["gpu_h_total"], 2) for x in seeds),
                   " / ".join(_fmt(x, 2) for x in m["gpu_h"]),
                   *[_fmt(a) + " (" + " / ".join(_fmt(x["attainment"][i]) for x in seeds) + ")"
                     for i, a in enumerate(m["attainment"])],
                   _fmt(m["worst_minute"]),
                   " / ".join(str(sum(x["served"])) for x in seeds)]  # fmt: skip
            if cell["trace"] == "flash":
                row[-1:-1] = [_fmt(a) for a in m["flash_attainment"]]
            rows.append(row)
        out.append((f"{key} ({cell['duration_s']:g} virtual s)", head, rows))
    out.append(
        (
            "Goals",
            ["goal", "measured", "verdict"],
            [[g["goal"], g["measured"], g["verdict"]] for g in report["goals"]],
        )
    )
    return out


def print_report(console: Console, report: dict[str, Any]) -> None:
    print_tables(sections(report), console, left=("arm", "goal", "measured"))
    console.print(f"{report['wall_s']:.0f} s of wall time on {report['nproc']} CPUs")


def write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "autoscale.json").write_text(json.dumps(report, indent=1, allow_nan=True) + "\n")
    png = None
    try:
        draw(report, out / "autoscale.png")
        png = "autoscale.png"
    except ImportError:
        pass
    parts = [
        "# Autoscaling on a virtual clock: the planner against the HPAs",
        "",
        f"`{report['command']}` (code {report['code']['commit']}"
        + (
            ", modified: " + ", ".join(report["code"]["modified"])
            if report["code"]["modified"]
            else ""
        )
        + f"), {report['wall_s']:.0f} s of wall "
        f"time on {report['nproc']} CPUs. Data: [autoscale.json](autoscale.json).",
        "",
    ]
    for d, about in report["deployments"].items():
        parts.append(
            f"- `{d}`: {about}; one pool replica's ceiling "
            f"{report['ceilings'][d]:.2f} requests/s (the traces' unit)"
        )
    scale = report.get("time_scale", 1.0)
    for t, about in report["traces"].items():
        parts.append(f"- `{t}`: {about}" + (f" (here every length x {scale:g}; the start-up "
                                              "delays and the HPA's windows are not scaled)"
                                              if scale != 1.0 else ""))
    parts.append(
        "- Each cell: per arm the median over seeds, then each seed's value. "
        "Attainment: the share of a class's requests that met both its TTFT and TPOT "
        "SLO. GPU-hours: every replica from the moment it was asked for (start-up "
        "included) to the end of its last stream."
    )
    for title, head, rows in sections(report):
        parts += ["", f"## {title}", "", markdown_table(head, rows)]
    if png:
        parts += ["", f"![replicas over time, seed 0]({png})"]
    (out / "autoscale.md").write_text("\n".join(parts) + "\n")


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(report["cells"].values())
    fig, axes = plt.subplots(len(cells), 2, figsize=(13, 3.2 * len(cells)), squeeze=False)
    for row, cell in zip(axes, cells, strict=True):
        for arm, v in cell["arms"].items():
            seed = v["seeds"][0]
            tl = seed["timeline"]
            t = [x[0] / 60 for x in tl]
            (line,) = row[0].step(t, [x[2] for x in tl], where="post", label=f"{arm} pool")
            row[0].step(t, [x[1] for x in tl], where="post", linestyle=":",
                        color=line.get_color(), label=f"{arm} latency")  # fmt: skip
            mins = seed["minutes"]
            row[1].plot(range(len(mins)), mins, label=arm, color=line.get_color(), linewidth=1)
        row[0].set_title(f"{cell['deployment']} / {cell['trace']}: replicas asked for (seed 0)")
        row[0].set_xlabel("virtual minutes")
        row[0].legend(fontsize=7)
        row[1].set_title("SLO attainment of each minute's arrivals (seed 0)")
        row[1].set_xlabel("virtual minutes")
        row[1].set_ylim(0, 1.02)
        row[1].axhline(GOAL_FLASH, color="grey", linewidth=0.5)
        row[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
