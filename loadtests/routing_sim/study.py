"""`tiergate bench routing-sim`: the routing policies compared on a virtual clock, over many
deployments, load shapes, SLO classes and seeds (loadtests.routing_sim.cosim runs each).

Per cell (deployment x shape x SLO class) and seed: `learned`, `golden-range` (default
parameters), `least-loaded`, and the oracle's sweep: golden-range with its golden range and hard
cap both at L and no hysteresis (the latency tier takes a request while it has fewer than L),
for every L of `ORACLE_LIMITS`, L = 0 being `throughput-only` (no latency tier). The oracle is
the sweep's best L by SLO-met count, chosen with hindsight per cell. A request counts when it
finished inside a phase and met its SLO (TTFT and TPOT); counts are summed over seeds and
compared against counting noise, 2 sqrt(a + b), as `tiergate bench routing` does.

Two workloads: `one-off` (every request a 50-token prompt of its own) and `chat` (conversations
of CHAT_TURNS turns opening with a CHAT_SYSTEM-token system prompt every conversation shares, each
turn resending the history and a new 50-token question: the engines' prefix caches and the
gateway's prefix affinity at work).

Beside the matrix: the `shift` deployment under a steady load of 48 users, traced (the
learned latency-tier limit and TPOT against the truth, and where requests went), and the
learned TPOT curves of three deployments against the closed-loop truth of their profiles.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engines.sim.profile import load_profile
from engines.sim.virtual import closed_loop
from gateway.routing import PolicyParams, Reason, Role, Slo
from loadtests.common.report import revision
from loadtests.common.stats import json_safe, ms
from loadtests.decision_cost import decision_alone
from loadtests.harness.deployments import DEPLOYMENTS, SLO_CLASSES, Deployment
from loadtests.harness.phases import SHAPES
from loadtests.routing_sim.cosim import CURVE_LEVELS, TRACE_AT, RunResult, RunSpec, simulate

__all__ = [
    "DEPLOYMENTS",
    "ORACLE_LIMITS",
    "SLO_CLASSES",
    "Arm",
    "Deployment",
    "Options",
    "arms",
    "run",
]

# The gateway's default SLO: what the traced latency-tier limit is computed against.
TRACE_SLO_TPOT_S: Final = 0.025
CONVERGED_WITHIN: Final = 0.15  # learned TPOT within this share of the truth
ORACLE_SHARE: Final = 0.95  # learned should reach this share of the oracle's count
SHIFT_USERS: Final = 48
SHIFT_PHASES: Final = 4  # the traced run: this many phases of steady load, the shift after one
TRUTH_LEVELS: Final = (1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64)
ORACLE_LIMITS: Final = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
CURVE_SHOWN: Final = (1, 8, 16, 24, 32, 48, 64)  # where the report compares learned and true
# The policies compared with the oracle; power-of-two is vLLM Router's.
# Windows in which learned's SLO-met count is compared with the oracle's, from a cold start.
WINDOW_S: Final = 10.0
PLAIN: Final = ("learned", "golden-range", "least-loaded", "power-of-two")


CURVE_DEPLOYMENTS: Final = ("little", "tutorial", "a-lot", "knee-64")
WORKLOADS: Final = ("one-off", "chat")
CHAT_TURNS: Final = 4
CHAT_SYSTEM: Final = 600  # tokens of the system prompt every conversation shares


@dataclass(frozen=True, slots=True)
class Arm:
    """One policy with its parameters, as the matrix runs it."""

    label: str
    policy: str
    params: PolicyParams = field(default_factory=PolicyParams)
    limit: int | None = None  # the oracle sweep's L


def oracle_arm(limit: int) -> Arm:
    """Golden-range with the latency tier taking work below `limit` and none past it; 0: the
    throughput tier only."""
    if limit == 0:
        return Arm("L=0", "throughput-only", limit=0)
    params = PolicyParams(latency_max_concurrency=limit, latency_hard_cap=limit, hysteresis=0)
    return Arm(f"L={limit}", "golden-range", params, limit)


def arms(limits: Iterable[int] = ORACLE_LIMITS) -> list[Arm]:
    return [Arm(p, p) for p in PLAIN] + [oracle_arm(limit) for limit in limits]


@dataclass(frozen=True, slots=True)
class Options:
    phase_s: float = 20.0
    # Six seeds: a cell's counts (~5,000 on the A100 engines, ~20,000 on the H200-like ones)
    # then carry a noise band of 2-4%, below the 5% the oracle verdict asks about. One run
    # takes 0.2-0.8 s on the A100 engines, 1-3 s on the faster H200-like ones: the whole
    # matrix (44 cells x 15 policies x 6) is about an hour on two cores, 6 minutes on 16.
    seeds: int = 6
    deployments: tuple[str, ...] = tuple(DEPLOYMENTS)
    shapes: tuple[str, ...] = tuple(SHAPES)
    slos: tuple[str, ...] = tuple(SLO_CLASSES)
    limits: tuple[int, ...] = ORACLE_LIMITS
    jobs: int = 0  # 0: one per CPU
    out: Path | None = None
    decision_calls: int = 100_000  # per policy and snapshot size, for the decision's cost alone
    workload: str = "one-off"  # or "chat": conversations (WORKLOADS)

    def command(self) -> str:
        """The command line that runs this study (defaults left out; no machine paths)."""
        default = Options()
        args = ["tiergate bench routing-sim"]
        if self.phase_s != default.phase_s:
            args.append(f"--phase-seconds {self.phase_s:g}")
        if self.seeds != default.seeds:
            args.append(f"--seeds {self.seeds}")
        for flag, mine, every in (
            ("--deployment", self.deployments, default.deployments),
            ("--shape", self.shapes, default.shapes),
            ("--slo", self.slos, default.slos),
        ):
            if mine != every:
                args += [f"{flag} {x}" for x in mine]
        if self.decision_calls != default.decision_calls:
            args.append(f"--decision-calls {self.decision_calls}")
        if self.workload != default.workload:
            args.append(f"--workload {self.workload}")
        if self.out is not None:
            args.append(f"--out {self.out if not self.out.is_absolute() else 'DIR'}")
        return " ".join(args)


def slo_of(name: str) -> Slo:
    """The SLO class as a request carries it."""
    c = SLO_CLASSES[name]
    return Slo(c.ttft_s, c.tpot_s)


Cell = tuple[str, str, str]  # deployment, shape, SLO class


def cells_of(opts: Options) -> list[Cell]:
    """Every deployment x shape x SLO class of the options, each deployment with its classes."""
    return [(d, shape, slo) for d in opts.deployments for shape in opts.shapes
            for slo in DEPLOYMENTS[d].slos if slo in opts.slos]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Task:
    kind: str  # "matrix", "shift" or "curves"
    key: tuple[Any, ...]
    spec: RunSpec


@dataclass(slots=True)
class Summary:
    """What the report needs of one run (computed in the worker: RunResults are large)."""

    met: int
    n: int
    sent: int
    saturated: int
    by_role: dict[str, dict[str, Any]]
    phases: list[dict[str, int]]
    windows: list[int]  # SLO-met requests finished in each WINDOW_S of the run
    phase_load: list[dict[str, float]]  # mean in-flight per backend and phase
    reasons: dict[str, int]
    decision_ns: list[int]
    decision_inflight: list[int]
    trace: list[dict[str, float]]
    curves: dict[str, list[tuple[float, float]]]
    profiles: dict[str, str]
    roles: dict[str, str]
    ejections: int
    inflight_left: int
    wall_s: float
    later: int = 0  # later turns of conversations, counted
    stayed: int = 0  # ... of them served where their conversation's last turn was
    cached: int = 0  # prompt tokens the engines' prefix caches supplied, counted requests


def summarize(result: RunResult) -> Summary:
    counted = [d for d in result.done if d.phase is not None]
    by_role: dict[str, dict[str, Any]] = {}
    for role in Role:
        mine = [d for d in counted if d.role is role]
        by_role[role.value] = {
            "n": len(mine),
            "met": sum(d.met for d in mine),
            "tpot": sorted(d.tpot for d in mine),
            "ttft": sorted(d.ttft for d in mine),
        }
    phases = []
    for k in range(len(result.spec.users)):
        mine = [d for d in counted if d.phase == k]
        phases.append(
            {
                "n": len(mine),
                "met": sum(d.met for d in mine),
                "latency": sum(d.role is Role.LATENCY for d in mine),
            }
        )
    windows = [0] * math.ceil(result.spec.duration / WINDOW_S)
    for d in counted:
        windows[min(len(windows) - 1, int(d.at // WINDOW_S))] += d.met
    return Summary(
        met=sum(d.met for d in counted),
        n=len(counted),
        sent=result.sent,
        saturated=result.reasons.get(Reason.SATURATED, 0),
        by_role=by_role,
        phases=phases,
        windows=windows,
        phase_load=result.phase_load,
        reasons={str(k): v for k, v in result.reasons.items()},
        decision_ns=result.decision_ns,
        decision_inflight=result.decision_inflight,
        trace=[
            {
                "t": p.t,
                "limit": p.limit,
                "tpot_at": p.tpot_at,
                "tokens_per_step": p.tokens_per_step,
                "routed": p.routed,
                "routed_latency": p.routed_latency,
                "inflight": p.inflight,
            }
            for p in result.trace
        ],
        curves=result.curves,
        profiles=result.profiles,
        roles={u: r.value for u, r in result.roles.items()},
        ejections=result.ejections,
        inflight_left=result.inflight_left,
        wall_s=result.wall_s,
        later=sum(d.turn > 0 for d in counted),
        stayed=sum(d.stayed for d in counted),
        cached=sum(d.cached for d in counted),
    )


def _work(task: Task) -> tuple[Task, Summary]:
    return task, summarize(simulate(task.spec))


# -- the tasks -------------------------------------------------------------------------------
def spec_of(cell: Cell, arm: Arm, seed: int, phase_s: float, workload: str = "one-off") -> RunSpec:
    deployment, shape, slo = cell
    d = DEPLOYMENTS[deployment]
    users = SHAPES[shape]
    chat = workload == "chat"
    return RunSpec(
        d.latency,
        d.throughput,
        users,
        phase_s,
        slo_of(slo),
        arm.policy,
        arm.params,
        seed,
        d.shifts(len(users) * phase_s),
        turns=CHAT_TURNS if chat else 1,
        system_tokens=CHAT_SYSTEM if chat else 0,
    )


def shift_spec(seed: int, phase_s: float) -> RunSpec:
    """`shift` under a steady load: one phase before the shift, the rest after it."""
    d = DEPLOYMENTS["shift"]
    assert d.shift is not None
    users = (SHIFT_USERS,) * SHIFT_PHASES
    spec = load_profile(d.shift[1]).speculative
    assert spec is not None
    return RunSpec(
        d.latency,
        d.throughput,
        users,
        phase_s,
        slo_of("standard"),
        "learned",
        seed=seed,
        shifts=((phase_s, spec.acceptance),),
        trace=True,
    )


def tasks(opts: Options) -> list[Task]:
    out = []
    for cell in cells_of(opts):
        for arm in arms(opts.limits):
            for seed in range(opts.seeds):
                spec = spec_of(cell, arm, seed, opts.phase_s, opts.workload)
                out.append(Task("matrix", (cell, arm.label, seed), spec))
    for seed in range(opts.seeds):
        out.append(Task("shift", (seed,), shift_spec(seed, opts.phase_s)))
    for deployment in CURVE_DEPLOYMENTS:
        cell = (deployment, "step", "standard")
        out.append(
            Task("curves", (deployment,), spec_of(cell, Arm("learned", "learned"), 0, opts.phase_s))
        )
    return out


# -- the truth -------------------------------------------------------------------------------
@cache
def true_tpot(profile: str, n: int, acceptance: tuple[float, ...] | None = None) -> float:
    """The median TPOT of `n` closed-loop users on one engine of `profile` (with another
    acceptance vector if given): engines.sim.virtual, the profiles' own fitting harness."""
    p = load_profile(profile)
    if acceptance is not None and p.speculative is not None:
        p = p.model_copy(update={"speculative": p.speculative.with_acceptance(acceptance)})
    return closed_loop(p, n).median("tpot")


def true_limit(profile: str, tpot_s: float, upto: int = 64) -> int:
    """The most streams at which the true TPOT still meets `tpot_s` (bisection: the curve
    crosses an SLO once, on its steep part)."""
    if true_tpot(profile, 1) > tpot_s:
        return 0
    lo, hi = 1, upto
    if true_tpot(profile, hi) <= tpot_s:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if true_tpot(profile, mid) <= tpot_s else (lo, mid)
    return lo


# -- the report ------------------------------------------------------------------------------
def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _pooled(runs: Sequence[Summary]) -> dict[str, Any]:
    """One policy in one cell, its seeds pooled."""
    n = sum(r.n for r in runs)
    roles: dict[str, Any] = {}
    for role in Role:
        k = role.value
        tpot = [x for r in runs for x in r.by_role[k]["tpot"]]
        ttft = [x for r in runs for x in r.by_role[k]["ttft"]]
        count = sum(r.by_role[k]["n"] for r in runs)
        roles[k] = {
            "n": count,
            "share": count / n if n else 0.0,
            "met": sum(r.by_role[k]["met"] for r in runs),
            "tpot_p50_ms": _pct(tpot, 50) * 1000,
            "tpot_p99_ms": _pct(tpot, 99) * 1000,
            "ttft_p50_ms": _pct(ttft, 50) * 1000,
        }
    phases = [
        {key: sum(r.phases[i][key] for r in runs) for key in ("n", "met", "latency")}
        for i in range(len(runs[0].phases))
    ]
    # Mean in-flight per phase, seeds averaged, per backend (latency first, as run).
    load = [
        [statistics.fmean(r.phase_load[i][u] for r in runs) for u in runs[0].phase_load[i]]
        for i in range(len(runs[0].phase_load))
    ]
    reasons: dict[str, int] = {}
    for r in runs:
        for k, v in r.reasons.items():
            reasons[k] = reasons.get(k, 0) + v
    return {
        "met": sum(r.met for r in runs),
        "n": n,
        "per_seed": [r.met for r in runs],
        "windows": [sum(w) for w in zip(*(r.windows for r in runs), strict=True)],
        "saturated": sum(r.saturated for r in runs),
        "roles": roles,
        "phases": phases,
        "phase_load": load,
        "reasons": reasons,
    }


def verdict(a: int, b: int, target: float) -> dict[str, Any]:
    """`a` against `target` (a share of `b`), with the noise band of the counts a and b."""
    noise = 2 * math.sqrt(a + b)
    if a >= target:
        text = "MET"
    elif a >= target - noise:
        text = "within noise"
    else:
        text = "NOT MET"
    return {"value": a, "target": round(target, 1), "noise": round(noise, 1), "text": text}


def settled_at(mine: Sequence[int], theirs: Sequence[int], share: float) -> float | None:
    """The start (virtual s) of the first window from which on every window's count in `mine`
    is at least `share` of the one in `theirs`, short of it by no more than the counting noise
    2 sqrt(a + b); None: not even the last window."""
    settled: float | None = None
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a >= share * b - 2 * math.sqrt(a + b):
            settled = i * WINDOW_S if settled is None else settled
        else:
            settled = None
    return settled


def cell_report(
    cell: Cell, runs: dict[str, list[Summary]], limits: Sequence[int]
) -> dict[str, Any]:
    pooled = {label: _pooled(r) for label, r in runs.items()}
    sweep = {str(limit): pooled[f"L={limit}"] for limit in limits}
    best = max(limits, key=lambda limit: sweep[str(limit)]["met"])  # first of equals: smallest
    oracle = sweep[str(best)]["met"]
    learned, golden = pooled["learned"]["met"], pooled["golden-range"]["met"]
    two = pooled["power-of-two"]["met"]
    deployment, shape, slo = cell
    windows = pooled["learned"]["windows"], sweep[str(best)]["windows"]
    return {
        "learned_curve": learned_curve(deployment, runs["learned"][0]),
        "deployment": deployment,
        "shape": shape,
        "slo": slo,
        "policies": {p: pooled[p] for p in PLAIN},
        "sweep": sweep,
        "oracle": {"limit": best, "met": oracle, "n": sweep[str(best)]["n"]},
        "learned_over_oracle": learned / oracle if oracle else math.nan,
        "vs_oracle": verdict(learned, oracle, ORACLE_SHARE * oracle),
        "vs_golden": verdict(learned, golden, golden),
        "vs_two_choices": verdict(learned, two, two),
        # From a cold start: when learned's windows reach 95% of the oracle's for good.
        "settled_s": settled_at(*windows, ORACLE_SHARE),
        "window_ratios": [a / b if b else math.nan for a, b in zip(*windows, strict=True)],
    }


def learned_curve(deployment: str, s: Summary) -> dict[str, Any]:
    """The latency engine's learned TPOT curve at the end of a run (ms) against the truth of
    the acceptance it ran with last."""
    d = DEPLOYMENTS[deployment]
    url = min(u for u, role in s.roles.items() if role == Role.LATENCY.value)
    truth = d.shift[1] if d.shift else d.latency[0]
    return {
        "levels": list(CURVE_SHOWN),
        "learned_ms": [s.curves[url][n - 1][0] * 1000 for n in CURVE_SHOWN],
        "true_ms": [true_tpot(truth, n) * 1000 for n in CURVE_SHOWN],
        "true_profile": truth,
    }


def decision_cost(summaries: Iterable[Summary], at_least: int = 48) -> dict[str, Any]:
    ns = [x for s in summaries for x in s.decision_ns]
    busy = [
        t
        for s in summaries
        for t, n in zip(s.decision_ns, s.decision_inflight, strict=True)
        if n >= at_least
    ]
    return {
        "samples": len(ns),
        "p50_us": _pct(ns, 50) / 1000,
        "p99_us": _pct(ns, 99) / 1000,
        "at_least_inflight": at_least,
        "busy_samples": len(busy),
        "busy_p50_us": _pct(busy, 50) / 1000,
        "busy_p99_us": _pct(busy, 99) / 1000,
    }


def shift_report(runs: dict[int, Summary], phase_s: float) -> dict[str, Any]:
    d = DEPLOYMENTS["shift"]
    assert d.shift is not None
    # v4-low is v4's engine with v4-low's acceptance: the truth after the shift.
    truth = {
        "before": {
            "tpot_at_ms": true_tpot(d.latency[0], TRACE_AT) * 1000,
            "limit": true_limit(d.latency[0], TRACE_SLO_TPOT_S),
        },
        "after": {
            "tpot_at_ms": true_tpot(d.shift[1], TRACE_AT) * 1000,
            "limit": true_limit(d.shift[1], TRACE_SLO_TPOT_S),
        },
    }
    seeds: dict[str, dict[str, Any]] = {}
    for seed, s in sorted(runs.items()):
        took = converged_after(s.trace, phase_s, truth["after"]["tpot_at_ms"] / 1000)
        seeds[str(seed)] = {"converged_after_s": took}
        if len(seeds) == 1:  # the first seed's trace, for the plot
            seeds[str(seed)]["trace"] = s.trace
    return {
        "at_s": phase_s,
        "users": SHIFT_USERS,
        "duration_s": SHIFT_PHASES * phase_s,
        "trace_at": TRACE_AT,
        "truth": truth,
        "seeds": seeds,
    }


def converged_after(trace: Sequence[dict[str, float]], at: float, truth: float) -> float | None:
    """Seconds after `at` until the learned TPOT stays within CONVERGED_WITHIN of `truth` for
    the rest of the run (None: it never settles)."""
    after = [p for p in trace if p["t"] >= at]
    settled: float | None = None
    for p in after:
        ok = abs(p["tpot_at"] - truth) <= CONVERGED_WITHIN * truth
        if not ok:
            settled = None
        elif settled is None:
            settled = p["t"]
    return None if settled is None else settled - at


def curves_report(runs: dict[str, Summary]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for deployment, s in runs.items():
        backends = []
        for url, values in s.curves.items():
            profile = s.profiles[url]
            backends.append(
                {
                    "url": url,
                    "role": s.roles[url],
                    "profile": profile,
                    "learned_ms": [v * 1000 for v, _e in values],
                    "evidence": [e for _v, e in values],
                    "true_ms": {str(n): true_tpot(profile, n) * 1000 for n in TRUTH_LEVELS},
                }
            )
        out[deployment] = backends
    return out


# What a run imports: the gateway, the engines, this package, the load shapes, the stats.
CODE = ("gateway", "engines", "loadtests/routing_sim", "loadtests/harness/phases.py",
        "loadtests/harness/client.py", "loadtests/common")  # fmt: skip


def run(opts: Options, console: Console | None = None) -> dict[str, Any]:
    """Run the matrix and the traced scenarios; print the tables; write the files to `out`."""
    console = console or Console()
    code = revision(CODE)  # now: the code the runs import, not what the tree holds when they end
    todo = tasks(opts)
    done: list[tuple[Task, Summary]] = []
    jobs = opts.jobs or os.cpu_count() or 1
    t0 = time.perf_counter()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("routing-sim", total=len(todo))
        if jobs == 1:
            for t in todo:
                done.append(_work(t))
                progress.advance(bar)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for fut in as_completed([pool.submit(_work, t) for t in todo]):
                    done.append(fut.result())
                    progress.advance(bar)
    wall = time.perf_counter() - t0
    report = build_report(opts, done, wall, code)
    report["decision_alone"] = decision_alone(("learned", "golden-range", "least-loaded"),
                                              per_round=max(1, opts.decision_calls // 5))
    print_report(console, report)
    if opts.out is not None:
        write(opts.out, report)
        console.print(
            f"wrote routing-sim.md/.json/.png, learned-shift.png and "
            f"learned-curves.png to {opts.out}"
        )
    return report


def build_report(
    opts: Options, done: Sequence[tuple[Task, Summary]], wall: float, code: dict[str, Any]
) -> dict[str, Any]:
    matrix: dict[Cell, dict[str, list[tuple[int, Summary]]]] = {}
    shift: dict[int, Summary] = {}
    curves: dict[str, Summary] = {}
    for task, s in done:
        if task.kind == "matrix":
            cell, label, seed = task.key
            matrix.setdefault(cell, {}).setdefault(label, []).append((seed, s))
        elif task.kind == "shift":
            shift[task.key[0]] = s
        else:
            curves[task.key[0]] = s
    cells = []
    for cell in cells_of(opts):
        runs = {
            label: [s for _seed, s in sorted(r, key=lambda x: x[0])]
            for label, r in matrix[cell].items()
        }
        cells.append(cell_report(cell, runs, opts.limits))
    learned = [s for (t, s) in done if t.kind == "matrix" and t.key[1] == "learned"]
    golden = [s for (t, s) in done if t.kind == "matrix" and t.key[1] == "golden-range"]
    everything = [s for _t, s in done]
    later = sum(s.later for s in learned)
    return {
        "command": opts.command(),
        "date": time.strftime("%Y-%m-%d"),
        "revision": code,
        "options": {
            "phase_s": opts.phase_s,
            "seeds": opts.seeds,
            "limits": list(opts.limits),
            "deployments": list(opts.deployments),
            "shapes": list(opts.shapes),
            "slos": list(opts.slos),
            "workload": opts.workload,
        },
        # Conversations: the default policy's later turns served where the last one was.
        "affinity": {"later_turns": later, "stayed": sum(s.stayed for s in learned),
                     "share": sum(s.stayed for s in learned) / later if later else None},
        "deployments": {
            k: {
                "latency": list(d.latency),
                "throughput": list(d.throughput),
                "about": d.about,
                "slos": [k for k in d.slos if k in opts.slos],
                "shift": list(d.shift) if d.shift else None,
            }
            for k, d in DEPLOYMENTS.items()
            if k in opts.deployments
        },
        "shapes": {k: list(SHAPES[k]) for k in opts.shapes},
        "slo_classes": {
            k: {"ttft_s": SLO_CLASSES[k].ttft_s, "tpot_s": SLO_CLASSES[k].tpot_s} for k in opts.slos
        },
        "runs": len(done),
        "requests": sum(s.sent for s in everything),
        "wall_s": round(wall, 1),
        "sim_wall_s": round(sum(s.wall_s for s in everything), 1),
        "conservation": {
            "inflight_left": sum(s.inflight_left for s in everything),
            "ejections": sum(s.ejections for s in everything),
        },
        "cells": cells,
        "decision_cost": {"learned": decision_cost(learned), "golden-range": decision_cost(golden)},
        "shift": shift_report(shift, opts.phase_s),
        "curves": curves_report(curves),
    }


# -- output ----------------------------------------------------------------------------------


def _share(p: dict[str, Any]) -> str:
    return f"{p['roles']['latency']['share'] * 100:.0f}%"


def verdict_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in report["cells"]:
        pol, o = c["policies"], c["oracle"]
        rows.append(
            [
                c["deployment"],
                c["shape"],
                c["slo"],
                f"{pol['learned']['met']}/{pol['learned']['n']}",
                f"{pol['golden-range']['met']}/{pol['golden-range']['n']}",
                f"{pol['power-of-two']['met']}/{pol['power-of-two']['n']}",
                f"{o['met']}/{o['n']} (L={o['limit']})",
                f"{c['learned_over_oracle']:.3f}",
                f"{c['vs_oracle']['text']} (±{c['vs_oracle']['noise']:.0f})",
                f"{c['vs_golden']['text']} (±{c['vs_golden']['noise']:.0f})",
                f"{c['vs_two_choices']['text']} (±{c['vs_two_choices']['noise']:.0f})",
                "never" if c["settled_s"] is None else f"{c['settled_s']:g} s",
            ]
        )
    return rows


VERDICT_HEADER: Final = (
    "deployment",
    "shape",
    "SLO",
    "learned",
    "golden-range",
    "power-of-two",
    "oracle",
    "learned/oracle",
    ">= 95% of oracle",
    ">= golden-range",
    ">= power-of-two",
    "95% of oracle from",
)


def detail_rows(c: dict[str, Any]) -> list[list[str]]:
    rows = []
    entries = [(p, c["policies"][p]) for p in PLAIN]
    entries.append((f"oracle L={c['oracle']['limit']}", c["sweep"][str(c["oracle"]["limit"])]))
    for name, p in entries:
        lat, thr = p["roles"]["latency"], p["roles"]["throughput"]
        rows.append(
            [
                name,
                str(p["met"]),
                str(p["n"]),
                _share(p),
                ms(lat["tpot_p50_ms"]),
                ms(thr["tpot_p50_ms"]),
                ms(lat["ttft_p50_ms"]),
                ms(thr["ttft_p50_ms"]),
                str(p["saturated"]),
            ]
        )
    return rows


PHASE_HEADER: Final = (
    "phase",
    "users",
    "learned met/n",
    "learned in flight (lat, thr, thr)",
    "oracle met/n",
    "oracle in flight (lat, thr, thr)",
)


def phase_rows(c: dict[str, Any], users: Sequence[int]) -> list[list[str]]:
    """Per phase, learned against the oracle: SLO met, and the mean in-flight count of each
    backend (seeds averaged)."""
    learned = c["policies"]["learned"]
    oracle = c["sweep"][str(c["oracle"]["limit"])]
    rows = []
    for i, u in enumerate(users):
        row = [str(i + 1), str(u)]
        for p in (learned, oracle):
            ph = p["phases"][i]
            row += [f"{ph['met']}/{ph['n']}", ", ".join(f"{x:.1f}" for x in p["phase_load"][i])]
        rows.append(row)
    return rows


DETAIL_HEADER: Final = (
    "policy",
    "SLO met",
    "n",
    "to latency",
    "TPOT p50 lat (ms)",
    "TPOT p50 thr (ms)",
    "TTFT p50 lat (ms)",
    "TTFT p50 thr (ms)",
    "saturated",
)


def print_report(console: Console, report: dict[str, Any]) -> None:
    t = Table(title="learned vs the oracle and golden-range (SLO-met requests / n, seeds summed)")
    for col in VERDICT_HEADER:
        t.add_column(col, justify="left" if col in ("deployment", "shape", "SLO") else "right")
    for row in verdict_rows(report):
        t.add_row(*row)
    console.print(t)
    for line in summary_lines(report):
        console.print(line, markup=False)
    for c in report["cells"]:
        d = Table(title=f"{c['deployment']} / {c['shape']} / {c['slo']}")
        for col in DETAIL_HEADER:
            d.add_column(col, justify="left" if col == "policy" else "right")
        for row in detail_rows(c):
            d.add_row(*row)
        console.print(d)
    for line in alone_lines(report["decision_alone"]):
        console.print(line)
    for name, cost in report["decision_cost"].items():
        console.print(
            f"{name} decision: p50 {cost['p50_us']:.1f} us, p99 {cost['p99_us']:.1f} us "
            f"({cost['samples']} decisions); at >= {cost['at_least_inflight']} in "
            f"flight p99 {cost['busy_p99_us']:.1f} us ({cost['busy_samples']})"
        )
    for line in shift_lines(report["shift"]):
        console.print(line)
    console.print(f"{report['runs']} runs, {report['requests']} requests, {report['wall_s']} s")


def alone_lines(alone: dict[str, Any]) -> list[str]:
    return [
        f"`{name}` alone, {size} backends: p50 {c['p50_us']:.1f} µs, p99 {c['p99_us']:.1f} µs "
        f"over {c['samples']} decisions ({alone['inflight']} in flight, {alone['rounds']} "
        "rounds, order rotated; loadtests.decision_cost)"
        for name, by_size in alone["policies"].items()
        for size, c in by_size.items()
    ]


def shift_lines(shift: dict[str, Any]) -> list[str]:
    truth = shift["truth"]
    lines = [
        f"shift: {shift['users']} users, the latency engine's acceptance drops at "
        f"{shift['at_s']:g} s; true TPOT at {shift['trace_at']} streams "
        f"{truth['before']['tpot_at_ms']:.1f} -> {truth['after']['tpot_at_ms']:.1f} ms, "
        f"true limit at 25 ms {truth['before']['limit']} -> {truth['after']['limit']} streams"
    ]
    for seed, s in shift["seeds"].items():
        after = s["converged_after_s"]
        when = "never within the run" if after is None else f"{after:.2f} s after the shift"
        lines.append(
            f"  seed {seed}: learned TPOT at {shift['trace_at']} within "
            f"{CONVERGED_WITHIN:.0%} of the truth {when}"
        )
    return lines


def write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(report, digits=5), indent=1, default=str, allow_nan=False)
    (out / "routing-sim.json").write_text(text + "\n")
    plot_matrix(report, out / "routing-sim.png")
    plot_shift(report["shift"], out / "learned-shift.png")
    plot_curves(report["curves"], out / "learned-curves.png")
    (out / "routing-sim.md").write_text(markdown(report))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_matrix(report: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    slos = [k for k in report["options"]["slos"] if any(c["slo"] == k for c in report["cells"])]
    widest = max(sum(c["slo"] == k for c in report["cells"]) for k in slos)
    fig, axes = plt.subplots(len(slos), 1, figsize=(max(13, 0.85 * widest), 4.2 * len(slos)),
                             squeeze=False)  # fmt: skip
    series: list[tuple[str, Callable[[dict[str, Any]], int]]] = [
        ("learned", lambda c: c["policies"]["learned"]["met"]),
        ("golden-range", lambda c: c["policies"]["golden-range"]["met"]),
        ("least-loaded", lambda c: c["policies"]["least-loaded"]["met"]),
        ("power-of-two", lambda c: c["policies"]["power-of-two"]["met"]),
        ("oracle", lambda c: c["oracle"]["met"]),
    ]
    width = 0.8 / len(series)
    for ax, slo in zip(axes[:, 0], slos, strict=True):
        cells = [c for c in report["cells"] if c["slo"] == slo]
        for k, (name, value) in enumerate(series):
            xs = [i + k * width for i in range(len(cells))]
            ax.bar(xs, [value(c) for c in cells], width, label=name)
        for i, c in enumerate(cells):
            top = c["oracle"]["met"]
            ax.annotate(
                f"L={c['oracle']['limit']}",
                (i + (len(series) - 1) * width, top),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))])
        ax.set_xticklabels([f"{c['deployment']}\n{c['shape']}" for c in cells])
        s = report["slo_classes"][slo]
        ax.set_ylabel("SLO-met requests (seeds summed)")
        ax.set_title(f"{slo}: TTFT <= {s['ttft_s']:g} s, TPOT <= {s['tpot_s'] * 1000:g} ms")
        ax.legend(fontsize=8, ncols=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_shift(shift: dict[str, Any], path: Path, window_s: float = 4.0) -> None:
    plt = _pyplot()
    seed = next(k for k, v in shift["seeds"].items() if "trace" in v)
    trace = shift["seeds"][seed]["trace"]
    truth, at = shift["truth"], shift["at_s"]
    ts = [p["t"] for p in trace]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)

    def true_line(ax: Any, key: str, scale: float = 1.0) -> None:
        end = ts[-1] if ts else at
        ax.step(
            [0, at, end],
            [
                truth["before"][key] * scale,
                truth["after"][key] * scale,
                truth["after"][key] * scale,
            ],
            where="post",
            color="k",
            ls="--",
            label="true",
        )

    ax = axes[0]
    top = 2 * max(truth["before"]["limit"], truth["after"]["limit"], 32)
    ax.plot(ts, [min(p["limit"], top) for p in trace], label=f"learned (clipped at {top})")
    true_line(ax, "limit")
    ax.set_ylim(0, top * 1.05)
    ax.set_ylabel(f"latency-tier limit\n(streams, TPOT <= {TRACE_SLO_TPOT_S * 1000:g} ms)")
    ax = axes[1]
    ax.plot(ts, [p["tpot_at"] * 1000 for p in trace], label="learned")
    true_line(ax, "tpot_at_ms")
    after = truth["after"]["tpot_at_ms"]
    ax.axhspan(
        after * (1 - CONVERGED_WITHIN),
        after * (1 + CONVERGED_WITHIN),
        color="k",
        alpha=0.08,
        label=f"±{CONVERGED_WITHIN:.0%} of the truth after",
    )
    ax.set_ylabel(f"TPOT at {shift['trace_at']} streams (ms)")
    ax = axes[2]
    windows: dict[int, list[int]] = {}
    for p in trace:
        w = windows.setdefault(int(p["t"] // window_s), [0, 0])
        w[0] += int(p["routed_latency"])
        w[1] += int(p["routed"])
    xs = [(k + 0.5) * window_s for k in sorted(windows)]
    ax.plot(
        xs,
        [windows[k][0] / windows[k][1] if windows[k][1] else math.nan for k in sorted(windows)],
        drawstyle="steps-mid",
        label="routed to latency",
    )
    ax.set_ylabel(f"share to the latency tier\n({window_s:g} s windows)")
    ax.set_ylim(0, 1.05)
    ax2 = ax.twinx()
    ax2.plot(ts, [p["inflight"] for p in trace], color="tab:orange", alpha=0.5)
    ax2.set_ylabel("latency tier in flight", color="tab:orange")
    ax.set_xlabel("virtual seconds")
    conv = shift["seeds"][seed]["converged_after_s"]
    for a in axes:
        a.axvline(at, color="tab:red", lw=1)
        a.legend(fontsize=8, loc="upper right")
    note = "never" if conv is None else f"{conv:.1f} s after it"
    axes[0].set_title(
        f"shift: v4's acceptance drops to v4-low's at {at:g} s under "
        f"{shift['users']} users (seed {seed}); learned TPOT within "
        f"{CONVERGED_WITHIN:.0%}: {note}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(curves: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(curves), figsize=(5.5 * len(curves), 4.5), squeeze=False, sharey=True
    )
    for ax, (deployment, backends) in zip(axes[0], curves.items(), strict=True):
        shown_truth: set[str] = set()
        for k, b in enumerate(backends):
            color = f"C{k}"
            name = f"{b['role']} {b['url'].split('//')[1].split('.')[0]} ({b['profile']})"
            ax.plot(CURVE_LEVELS, b["learned_ms"], color=color, label=f"learned: {name}")
            seen = [
                (n, v)
                for n, v, e in zip(CURVE_LEVELS, b["learned_ms"], b["evidence"], strict=True)
                if e >= 0.5
            ]
            if seen:
                ax.plot(*zip(*seen, strict=True), ".", color=color, ms=3)
            if b["profile"] not in shown_truth:
                shown_truth.add(b["profile"])
                levels = [int(n) for n in b["true_ms"]]
                ax.plot(
                    levels,
                    list(b["true_ms"].values()),
                    "--",
                    color=color,
                    marker="x",
                    ms=4,
                    label=f"true: {b['profile']} closed loop",
                )
        for slo, s in SLO_CLASSES.items():
            ax.axhline(s.tpot_s * 1000, color="grey", lw=0.8, ls=":")
            ax.annotate(slo, (64, s.tpot_s * 1000), ha="right", va="bottom", fontsize=7)
        ax.set_title(f"{deployment}: learned TPOT after a step run")
        ax.set_xlabel("streams on the backend")
        ax.set_ylim(0, 60)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("TPOT (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(report: dict[str, Any]) -> str:
    o, rev = report["options"], report["revision"]
    modified = (
        f" with uncommitted changes to {', '.join(rev['modified'])}" if rev["modified"] else ""
    )
    lines = [
        "# Routing policies on a virtual clock",
        "",
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}. Code: commit {rev['commit']}{modified}.  ",
        "A discrete-event simulation, not HTTP: the gateway's real routing policies "
        "(`gateway.routing.build_policy`), registry, monitor bookkeeping and latency model "
        "(`gateway.backends.learner.Learner`) drive the simulator's real scheduler "
        "(`engines.sim.scheduler.Scheduler` with the fitted profiles) on a virtual clock. "
        "Scrapes every 0.25 virtual s; requests are streams of 50 prompt and 256 output "
        "tokens from closed-loop users (`loadtests.harness.phases` shapes), all of one SLO class "
        "per "
        "run (the request carries it, as `x-tiergate-slo-*` headers would)"
        + (f"; each user holds conversations of {CHAT_TURNS} turns, opening with a "
           f"{CHAT_SYSTEM}-token system prompt every conversation shares, each turn resending "
           "the history (earlier questions and answers) and a new question, the engines' prefix "
           "caches on (a later turn served where its conversation was finds it cached), tiergate's"
           " prefix affinity at its defaults in every arm" if o.get("workload") == "chat"
           else "") + ". The gateway runs "
        "its default configuration otherwise (`tiergate up`'s: policy parameters, learning "
        "settings) and starts cold in every run: nothing is known of any backend. No admission "
        "control: a decision reported `saturated` still goes to its primary (counted below). "
        "`power-of-two` is vLLM Router's and SGLang's policy of that name as they run in front "
        "of vLLM (the less loaded by the router's in-flight count of two backends drawn at "
        "random, tiers unknown to it), in the same simulation.  ",
        f"{report['runs']} runs, {report['requests']} requests; phases of {o['phase_s']:g} "
        f"virtual s, {o['seeds']} seed{'s' if o['seeds'] != 1 else ''} per cell, counts "
        "summed over seeds; a request counts "
        "in the phase in which it finished (those finishing after the last phase do not). "
        f"Oracle: golden-range with golden range = hard cap = L and no hysteresis, L in "
        f"{', '.join(map(str, o['limits']))} (0: throughput-only), the best L per cell with "
        f"hindsight (the maximum of {len(o['limits'])} noisy counts, so it is biased upward). "
        "Noise: two "
        "counts a, b differ when further apart than 2 sqrt(a + b). Wall time "
        f"{report['wall_s']:g} s.",
        "",
        "Deployments (`loadtests/harness/deployments.py`; engine profiles in "
        "`engines/sim/profiles`): "
        + "; ".join(
            f"`{k}` = {' + '.join(d['latency'])} + {' + '.join(d['throughput'])} ({d['about']})"
            + (
                f", acceptance becomes {d['shift'][1]}'s at {d['shift'][0]:.0%} of the run"
                if d["shift"]
                else ""
            )
            for k, d in report["deployments"].items()
        )
        + ".  ",
        "SLO classes: "
        + "; ".join(
            f"{k}: TTFT <= {s['ttft_s']:g} s, TPOT <= {s['tpot_s'] * 1000:g} ms"
            for k, s in report["slo_classes"].items()
        )
        + ". Shapes: "
        + "; ".join(f"{k} {'/'.join(map(str, u))} users" for k, u in report["shapes"].items())
        + ".",
        "",
        "![SLO-met requests per cell](routing-sim.png)",
        "",
        "## Verdicts",
        "",
        "learned >= 95% of the oracle's count, learned >= golden-range's and >= power-of-two's "
        '("within noise": short of the target by less than the noise band). "95% of oracle '
        f"from\": from a cold start, the first {WINDOW_S:g}-s window from which on learned's "
        "SLO-met count is at least 95% of the oracle's in every window (seeds pooled; short "
        "of it by no more than the noise of the two windows' counts).",
        "",
    ]
    lines += _md_table(VERDICT_HEADER, verdict_rows(report))
    lines += ["", *summary_lines(report)]
    lines += [
        "",
        "## Per cell",
        "",
        "Where each policy put its requests (share to the latency tier) and what they saw "
        "there (p50 over the requests of all seeds).",
        "",
    ]
    for c in report["cells"]:
        lines += [f"### {c['deployment']} / {c['shape']} / {c['slo']}", ""]
        lines += _md_table(DETAIL_HEADER, detail_rows(c))
        sweep = " · ".join(f"L={k}: {v['met']}" for k, v in c["sweep"].items())
        lines += ["", f"Oracle sweep (SLO met): {sweep}", ""]
        lines += _md_table(PHASE_HEADER, phase_rows(c, report["shapes"][c["shape"]]))
        curve = c["learned_curve"]
        lines += [
            "",
            f"Latency engine's TPOT (ms) at {'/'.join(map(str, curve['levels']))} "
            "streams: learned at the end of seed 0's run "
            f"{' / '.join(f'{v:.1f}' for v in curve['learned_ms'])}; true "
            f"({curve['true_profile']}) {' / '.join(f'{v:.1f}' for v in curve['true_ms'])}.",
            "",
        ]
    lines += ["## Decision cost", ""]
    lines += [f"- {line}" for line in alone_lines(report["decision_alone"])]
    for name, cost in report["decision_cost"].items():
        lines.append(
            f"- `{name}`: p50 {cost['p50_us']:.1f} µs, p99 {cost['p99_us']:.1f} µs over "
            f"{cost['samples']} decisions; with >= {cost['at_least_inflight']} requests in "
            f"flight p50 {cost['busy_p50_us']:.1f} µs, p99 {cost['busy_p99_us']:.1f} µs over "
            f"{cost['busy_samples']} decisions (the policy call alone, `time.perf_counter_ns`, "
            "inside the simulation, in worker processes sharing the machine's cores)."
        )
    shift = report["shift"]
    lines += [
        "",
        "## Acceptance shift",
        "",
        "![learned limit after the shift](learned-shift.png)",
        "",
    ]
    lines += [f"- {line.strip()}" for line in shift_lines(shift)]
    lines += [
        "",
        "The truth: the median TPOT of closed-loop users on one engine of the profile "
        "(`engines.sim.virtual.closed_loop`), before (v4) and after (v4-low's acceptance).",
        "",
        "## Learned curves",
        "",
        "![learned TPOT curves](learned-curves.png)",
        "",
        "Each backend's learned TPOT curve after a step run (standard SLO, seed 0; dots: "
        "concurrencies with evidence) against the closed-loop truth of its profile.",
        "",
    ]
    return "\n".join(lines)


def summary_lines(report: dict[str, Any]) -> list[str]:
    """How the verdicts came out, and where golden-range beat every fixed limit."""
    cells = report["cells"]
    out = []
    for key, name in (("vs_oracle", ">= 95% of the oracle"), ("vs_golden", ">= golden-range"),
                      ("vs_two_choices", ">= power-of-two")):  # fmt: skip
        counts = {t: sum(c[key]["text"] == t for c in cells)
                  for t in ("MET", "within noise", "NOT MET")}  # fmt: skip
        out.append(f"- learned {name}: " + ", ".join(f"{t} in {n}" for t, n in counts.items())
                   + f" of {len(cells)} cells.")  # fmt: skip
    beaten = [f"{c['deployment']}/{c['shape']}/{c['slo']}" for c in cells
              if c["policies"]["golden-range"]["met"] > c["oracle"]["met"]]  # fmt: skip
    if beaten:
        out.append("- golden-range beat every fixed limit of the sweep in " + ", ".join(beaten)
                   + " (its sharing past the golden range, up to the hard cap, is not a fixed "
                   "limit): the oracle is the best fixed limit, not an upper bound.")  # fmt: skip
    aff = report.get("affinity") or {}
    if aff.get("later_turns"):
        out.append(f"- learned's later turns of conversations served where their conversation's "
                   f"last turn was: {aff['stayed']} of {aff['later_turns']} "
                   f"({aff['share']:.1%}), over every cell and seed.")  # fmt: skip
    return out


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out
