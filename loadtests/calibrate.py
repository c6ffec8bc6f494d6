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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from engines.sim.fit import METRICS, load_targets
from engines.sim.launch import SimProcess, cpu_meter
from engines.sim.profile import load_profile
from engines.sim.virtual import closed_loop as virtual_loop
from engines.sim.virtual import single_request_estimate
from loadtests.client import LoopStats, closed_loop

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


def _model_value(
    profile_name: str, concurrency: int, metric: str, workload: dict[str, int], rpu: int
) -> float:
    r = virtual_loop(
        load_profile(profile_name),
        concurrency,
        prompt_tokens=workload["prompt_tokens"],
        output_tokens=workload["output_tokens"],
        requests_per_user=rpu,
    )
    if metric == "tok_s":
        return r.tok_s
    return r.median(metric.split("_")[0]) * (1000.0 if metric.endswith("_ms") else 1.0)


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


def run(
    profiles: list[str] | None,
    *,
    requests_per_user: int | None = None,
    out: Path | None = None,
    console: Console | None = None,
) -> list[CellResult]:
    console = console or Console()
    data = load_targets()
    tolerance = float(data.get("tolerance", 0.10))
    rpu = requests_per_user or int(data["requests_per_user"])
    workload: dict[str, int] = data["workload"]
    cells: list[CellResult] = []
    cpu: dict[tuple[str, int], float] = {}
    loops: dict[tuple[str, int], LoopStats] = {}
    names = profiles or list(data["profiles"])
    with Progress(console=console, transient=True) as progress:
        for name in names:
            spec = data["profiles"][name]
            rows: list[tuple[dict[str, Any], bool]] = [(r, True) for r in spec["match"]] + [
                (r, False) for r in spec.get("unmatched", [])
            ]
            prof = load_profile(name)
            speedup = SERIAL_SPEEDUP if prof.serial else 1.0
            stagger = (
                single_request_estimate(prof, workload["prompt_tokens"], workload["output_tokens"])
                / speedup
            )
            args = ["--speedup", str(speedup)] if speedup != 1 else []
            with SimProcess(name, args=args) as sim:
                for c in sorted({int(r["concurrency"]) for r, _ in rows}):
                    label = f"{name} c={c}"
                    with cpu_meter(sim.pid) as used:
                        stats = asyncio.run(
                            _measure(sim.url, c, workload, rpu, stagger, progress, label)
                        )
                    cpu[(name, c)] = used[0]
                    loops[(name, c)] = stats
                    if stats.errors:
                        console.print(f"[red]{label}: {stats.errors} requests failed")
                    for row, claimed in rows:
                        if int(row["concurrency"]) != c:
                            continue
                        for m in METRICS:
                            if m not in row:
                                continue
                            cells.append(
                                CellResult(
                                    name,
                                    c,
                                    m,
                                    float(row[m]),
                                    _model_value(name, c, m, workload, rpu),
                                    _value(stats, m, speedup),
                                    len(stats.measured()),
                                    claimed,
                                    tolerance,
                                    " ".join(str(row.get("reason", "")).split()),
                                )
                            )
    _print(console, cells, cpu)
    _crossover(console, loops)
    if out:
        out.write_text(json.dumps([asdict(c) | {"ratio": c.ratio, "ok": c.ok} for c in cells],
                                  indent=2))  # fmt: skip
    return cells


def _print(console: Console, cells: list[CellResult], cpu: dict[tuple[str, int], float]) -> None:
    t = Table(title="Simulator profiles vs the tutorial's table (medians; tok/s over a window)")
    for col in ("profile", "conc", "metric", "table", "model", "measured", "n", "ratio", "",
                "sim CPU"):  # fmt: skip
        t.add_column(col, justify="right" if col not in ("profile", "metric", "") else "left")
    for c in cells:
        mark = ("[green]match" if c.ok else "[red]MISS") if c.claimed else "[yellow]unmatched"
        t.add_row(c.profile, str(c.concurrency), c.metric, f"{c.target:g}", f"{c.model:.4g}",
                  f"{c.measured:.4g}", str(c.samples), f"{c.ratio:.3f}", mark,
                  f"{cpu[(c.profile, c.concurrency)]:.2f}")  # fmt: skip
    console.print(t)
    for c in cells:
        if not c.claimed:
            console.print(f"[yellow]{c.profile} c={c.concurrency} {c.metric}[/]: {c.reason}")
    claimed = [c for c in cells if c.claimed]
    bad = [c for c in claimed if not c.ok]
    tol = claimed[0].tolerance if claimed else 0.0
    console.print(f"{len(claimed) - len(bad)}/{len(claimed)} claimed cells within ±{tol:.0%}")


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
