"""The calibration benchmark: each simulator profile, over HTTP, against the tutorial's cells.

For every cell of engines/sim/profiles/targets.yaml it prints the table's value, what the profile's
model predicts (the scheduler on a virtual clock), what a real simulator process measured through
HTTP with a closed-loop streaming client, and the ratio measured / table. Cells a profile claims
must land within the tolerance; unmatched cells are shown with their reason. It also reports the
speculative crossover and the simulator's CPU use at each concurrency.

The serial profiles (v0, v1: one request at a time, ~10 s each) would need many minutes per
cell in real time: they run with `--speedup` and their times are scaled back.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from engines.sim.fit import METRICS, load_targets
from engines.sim.profile import load_profile
from engines.sim.virtual import LoopResult, single_request_estimate
from engines.sim.virtual import closed_loop as virtual_loop
from loadtests.common.options import setup_logging
from loadtests.harness.client import LoopStats, closed_loop
from loadtests.harness.procs import SimProcess, cpu_meter
from loadtests.harness.stack import start_stack

SERIAL_SPEEDUP = 25.0


@dataclass(frozen=True)
class CellResult:
    profile: str
    concurrency: int
    metric: str
    target: float
    model: float
    measured: float
    samples: int
    claimed: bool
    tolerance: float
    reason: str = ""

    @property
    def ratio(self) -> float:
        return self.measured / self.target

    @property
    def ok(self) -> bool:
        return not self.claimed or abs(self.ratio - 1) <= self.tolerance


def _value(stats: LoopStats, metric: str, speedup: float) -> float:
    if metric == "tok_s":
        return stats.tok_s / speedup
    scale = (1000.0 if metric.endswith("_ms") else 1.0) * speedup
    return stats.median(metric.split("_")[0]) * scale


def _model_value(result: LoopResult, metric: str) -> float:
    if metric == "tok_s":
        return result.tok_s
    return result.median(metric.split("_")[0]) * (1000.0 if metric.endswith("_ms") else 1.0)


async def _measure(
    url: str,
    concurrency: int,
    workload: dict[str, int],
    requests_per_user: int,
    stagger: float,
    progress: Progress,
    label: str,
) -> LoopStats:
    task = progress.add_task(label, total=concurrency * requests_per_user)
    stats = await closed_loop(
        url + "/v1/completions",
        concurrency,
        requests_per_user=requests_per_user,
        stagger_s=stagger,
        on_done=lambda _: progress.advance(task),
        prompt_tokens=workload["prompt_tokens"],
        output_tokens=workload["output_tokens"],
    )
    progress.remove_task(task)
    return stats


@dataclass(frozen=True)
class Fidelity:
    """One real-time run against the same scheduler on a virtual clock."""

    profile: str
    concurrency: int
    speedup: float
    cpu_cores: float
    measured: dict[str, float]
    model: dict[str, float]


@contextmanager
def serve_profile(name: str, speedup: float, via: str) -> Iterator[tuple[str, int]]:
    """A simulator of the profile, reached directly or through a gateway: (URL, engine pid)."""
    args = ["--speedup", str(speedup)] if speedup != 1 else []
    if via == "direct":
        with SimProcess(profile=name, args=args) as sim:
            yield sim.url, sim.pid
        return
    with tempfile.TemporaryDirectory(prefix="tiergate-tables-") as tmp:
        # The table measures the engine through the gateway, not the gateway's admission
        # control: it must queue what the engine queues rather than shed it with 429s.
        stack = start_stack(Path(tmp), latency=0, throughput=1, throughput_profile=name,
                            speedup=speedup, log_level="warning",
                            policy={"max_waiting": 1_000_000, "queue_deadline_s": 600})  # fmt: skip
        try:
            yield stack.gateway.url, stack.throughput[0].pid
        finally:
            stack.stop()


def run(
    profiles: list[str] | None,
    *,
    requests_per_user: int | None = None,
    out: Path | None = None,
    console: Console | None = None,
    via: str = "direct",
    report: Path | None = None,
    speedup: float = 1.0,
) -> tuple[list[CellResult], list[Fidelity]]:
    console = console or Console(record=report is not None, width=140)
    data = load_targets()
    tolerance = float(data.get("tolerance", 0.10))
    rpu = requests_per_user or int(data["requests_per_user"])
    workload: dict[str, int] = data["workload"]
    cells: list[CellResult] = []
    fidelity: list[Fidelity] = []
    loops: dict[tuple[str, int], LoopStats] = {}
    with Progress(console=console, transient=True) as progress:
        for name in profiles or list(data["profiles"]):
            spec = data["profiles"][name]
            rows: list[tuple[dict[str, Any], bool]] = [(r, True) for r in spec["match"]] + [
                (r, False) for r in spec.get("unmatched", [])
            ]
            prof = load_profile(name)
            single = single_request_estimate(
                prof, workload["prompt_tokens"], workload["output_tokens"]
            )
            # Serial engines under concurrency queue for minutes in real time: run those cells
            # faster; single requests always run in real time. One engine per speed.
            groups: dict[float, list[int]] = {}
            for c in sorted({int(r["concurrency"]) for r, _ in rows}):
                sp = max(speedup, SERIAL_SPEEDUP if prof.serial and c > 1 else 1.0)
                groups.setdefault(sp, []).append(c)
            for cell_speedup, concurrencies in groups.items():
                with serve_profile(name, cell_speedup, via) as (url, pid):
                    for c in concurrencies:
                        label = f"{name} c={c}" + (" via gateway" if via == "gateway" else "")
                        stagger = single / cell_speedup
                        with cpu_meter(pid) as used:
                            stats = asyncio.run(
                                _measure(url, c, workload, rpu, stagger, progress, label)
                            )
                        if stats.errors:
                            first = next(r for r in stats.results if not r.ok)
                            console.print(f"[red]{label}: {stats.errors} requests failed, "
                                          f"e.g. status {first.status}: {first.error}")  # fmt: skip
                        loops[(name, c)] = stats
                        model = virtual_loop(
                            prof, c, prompt_tokens=workload["prompt_tokens"],
                            output_tokens=workload["output_tokens"], requests_per_user=rpu,
                        )  # fmt: skip
                        fidelity.append(Fidelity(
                            name, c, cell_speedup, used[0],
                            {m: _value(stats, m, cell_speedup) for m in METRICS},
                            {m: _model_value(model, m) for m in METRICS},
                        ))  # fmt: skip
                        for row, claimed in rows:
                            if int(row["concurrency"]) != c:
                                continue
                            reason = " ".join(str(row.get("reason", "")).split())
                            cells += [
                                CellResult(name, c, m, float(row[m]), _model_value(model, m),
                                           _value(stats, m, cell_speedup), len(stats.measured()),
                                           claimed, tolerance, reason)
                                for m in METRICS if m in row
                            ]  # fmt: skip
    _print(console, cells)
    _print_fidelity(console, fidelity)
    _crossover(console, loops)
    if out:
        out.write_text(json.dumps({
            "cells": [asdict(c) | {"ratio": c.ratio, "ok": c.ok} for c in cells],
            "fidelity": [asdict(f) for f in fidelity],
        }, indent=2))  # fmt: skip
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(
            "# Simulator calibration\n\n"
            f"Command: `tiergate bench calibrate`. Date: {time.strftime('%Y-%m-%d')}, on "
            f"{os.cpu_count()} CPU cores. Each cell: the tutorial's value, the profile's model "
            "(the scheduler on a virtual clock), the medians measured over HTTP against a real "
            "simulator process, and measured / table. `n` is the number of requests measured.\n\n"
            "```\n" + console.export_text() + "```\n"
        )
    return cells, fidelity


def _print(console: Console, cells: list[CellResult]) -> None:
    t = Table(title="Simulator profiles vs the tutorial's table (medians; tok/s over a window)")
    for col in ("profile", "conc", "metric", "table", "model", "measured", "n", "ratio", ""):
        t.add_column(col, justify="right" if col not in ("profile", "metric", "") else "left")
    for c in cells:
        mark = ("[green]match" if c.ok else "[red]MISS") if c.claimed else "[yellow]unmatched"
        t.add_row(c.profile, str(c.concurrency), c.metric, f"{c.target:g}", f"{c.model:.4g}",
                  f"{c.measured:.4g}", str(c.samples), f"{c.ratio:.3f}", mark)  # fmt: skip
    console.print(t)
    for c in cells:
        if not c.claimed:
            console.print(f"[yellow]{c.profile} c={c.concurrency} {c.metric}[/]: {c.reason}")
    claimed = [c for c in cells if c.claimed]
    bad = [c for c in claimed if not c.ok]
    tol = claimed[0].tolerance if claimed else 0.0
    console.print(f"{len(claimed) - len(bad)}/{len(claimed)} claimed cells within ±{tol:.0%}")


def _print_fidelity(console: Console, runs: list[Fidelity]) -> None:
    t = Table(title="Real time vs the profile's model (same scheduler on a virtual clock)")
    for col in ("profile", "conc", "speedup", "TTFT", "TPOT", "E2E", "tok/s", "sim CPU (cores)"):
        t.add_column(col, justify="left" if col == "profile" else "right")
    for f in runs:
        ratios = [f"{f.measured[m] / f.model[m]:.3f}" for m in METRICS]
        t.add_row(f.profile, str(f.concurrency), f"{f.speedup:g}x", *ratios, f"{f.cpu_cores:.2f}")
    console.print(t)
    console.print(
        "(ratios measured / model: 1.000 means the real-time engine kept the model's pace)"
    )


def _crossover(console: Console, loops: dict[tuple[str, int], LoopStats]) -> None:
    def get(p: str, c: int, what: str) -> float:
        s = loops.get((p, c))
        if s is None:
            return math.nan
        return s.tok_s if what == "tok_s" else s.median(what)

    for c in (1, 16):
        a, b = get("v4", c, "tpot"), get("v3", c, "tpot")
        if not math.isnan(a) and not math.isnan(b):
            verdict = "v4 faster" if a < b else "v4 NOT faster"
            console.print(f"crossover c={c}: TPOT v4 {a * 1e3:.1f} ms vs v3 {b * 1e3:.1f} ms "
                          f"({a / b:.2f}x) -> {verdict}")  # fmt: skip
    a, b = get("v4", 64, "tok_s"), get("v3", 64, "tok_s")
    if not math.isnan(a) and not math.isnan(b):
        verdict = "v4 loses" if a < b else "v4 does NOT lose"
        console.print(f"crossover c=64: throughput v4 {a:.0f} vs v3 {b:.0f} tok/s "
                      f"({a / b:.2f}x) -> {verdict}")  # fmt: skip


# -- the command ------------------------------------------------------------------------------


def command(
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

    setup_logging("warning")
    run(profiles or None, requests_per_user=requests_per_user, out=out, report=report)
