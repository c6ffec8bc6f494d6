"""The cost of one routing decision alone: each policy called in a loop on a fixed snapshot with
64 requests in flight, with 3 backends (1 latency + 2 throughput, as the tutorial) and with 16
(2 latency + 14 throughput), the latency model's predictions in it (learned from a roofline of
step times up to 32 streams, so the tables hold data, the step past the frontier and the bound
past it, as in the gateway).

This is the number the routing budget is about (the policy call in the gateway's process). The
co-simulation measures the same call inside a running simulation too, where another process
shares the cores and the caches are cold: both are reported.

Each backend has a prediction of its own, as in the gateway, and a prediction remembers what
decisions computed from it until the model learns again (gateway.routing.curves.Prediction:
`limits`, `outlooks`). So three scenes (`SCENES`):
- `moving`, what a gateway under load sees: requests of both classes (a quarter 12 ms, the
  12 ms ones' decisions not timed); after each decision a stream drawn among all ends and the
  request's starts where the decision sent it (64 in flight throughout); every `REFIT_EVERY`
  decisions every prediction forgets what it remembered, as a refit replaces it (the learner
  refits each backend that learned something once per scrape round, 0.25 s by default: 100
  decisions at 400 requests/s), and is told the limits of the classes in flight and the
  outlooks asked of it last, as the learner tells a new one
  (gateway.routing.learned.remember_limits, remember_outlooks; not timed: they run in the
  learner's round, not in a decision);
- `fixed`: one snapshot throughout, so every outlook after the first decision is remembered
  (the least a decision costs);
- `cold`: the same snapshot, every outlook forgotten before each decision (the most: as after
  a refit, for every candidate).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar

import typer
from rich.console import Console
from rich.progress import Progress

from gateway.backends.latency_model import BackendModel
from gateway.routing import (
    Backend,
    BackendLoad,
    LoadSnapshot,
    Policy,
    PolicyParams,
    Role,
    RouteRequest,
    RouterState,
    Slo,
    build_policy,
    learned,
)
from gateway.routing.curves import Prediction
from loadtests.common.report import revision

__all__ = [
    "GOALS_P99_US", "REFIT_EVERY", "ROUNDS", "SCENES", "SIZES", "TIGHT_SHARE", "Moving",
    "decision_alone", "goal_lines", "markdown", "one_pass", "one_run", "repeated", "snapshot",
    "still_bar",
]  # fmt: skip

_MODEL = "m"
_INFLIGHT = 64
SIZES = (3, 16)  # backends in the snapshot
SCENES = ("moving", "fixed", "cold")
REFIT_EVERY = 100  # decisions between two refits in the `moving` scene (see above)


def _prediction(role: Role) -> Prediction:
    """A model that has seen 1..32 streams of an engine whose step is a roofline."""
    model = BackendModel(memory=16, halflife_s=3.0, spread=0.1, ridge_max=2048)
    speculative = role is Role.LATENCY
    for n in range(1, 33):
        tokens = n * (6 if speculative else 1)
        step = 0.019 + 2e-6 * tokens + 3e-4 * max(0, tokens - 82)
        model.observe_request(0.0, (n, step / (3.26 if speculative else 1.0)), (n, 0.2))
    return model.prediction()


def snapshot(backends: int = 3) -> LoadSnapshot:
    """`backends` backends (an eighth of them, at least one, latency), 64 requests in flight
    spread over them, a quarter of each backend's with a 12 ms SLO and the rest 25 ms."""
    latency = max(1, backends // 8)
    out, loads, curves = [], {}, {}
    models = {role: _prediction(role) for role in Role}
    for i in range(backends):
        role = Role.LATENCY if i < latency else Role.THROUGHPUT
        b = Backend(f"http://backend-{i}:8000", role.value, role, frozenset({_MODEL}))
        n = _INFLIGHT // backends + (i < _INFLIGHT % backends)
        tight = n // 4
        out.append(b)
        loads[b.url] = BackendLoad(running=n, inflight=n, slos=((0.012, tight), (0.025, n - tight)))
        curves[b.url] = replace(models[role])  # its own, as in the gateway (and its memories)
    return LoadSnapshot(tuple(out), loads, 0.0, curves, distinct=True)  # as the registry's


def _forget(snap: LoadSnapshot, limits: bool) -> None:
    """What the predictions remember of past decisions forgotten (the outlooks; `limits`:
    the classes' limits too), as a refit's new predictions start."""
    for pred in snap.curves.values():
        # (getattr: a tree whose predictions remember no outlooks, compared with this one)
        if (outlooks := getattr(pred, "outlooks", None)) is not None:
            outlooks.clear()
        if limits:
            pred.limits.clear()
            if (peaks := getattr(pred, "peaks", None)) is not None:  # (none in an older tree)
                peaks.clear()


def _remembering(pred: Prediction) -> Prediction:
    """A copy of `pred` that remembers the outlooks it does: the prediction a refit replaces."""
    copy = replace(pred)
    copy.outlooks.update(pred.outlooks)
    return copy


TIGHT_SHARE = 0.25  # of the requests (and so of the streams), the 12 ms class's


class Moving:
    """The `moving` scene's snapshot. Requests come of both classes (`TIGHT_SHARE` of them
    12 ms, `tight()` draws the next one's); `step(url, tpot_s)` ends a stream drawn among all
    and starts the request's on `url`, where its decision sent it, so the streams settle where
    the policy puts them; every `refit_every` steps the predictions forget (a refit)."""

    def __init__(self, base: LoadSnapshot, seed: int, refit_every: int = REFIT_EVERY) -> None:
        self.snap = base
        self.streams = {url: dict(load.slos) for url, load in base.by_url.items()}
        self.total = sum(load.inflight for load in base.by_url.values())  # kept by every step
        self.rng = random.Random(seed)
        self.refit_every, self.steps = refit_every, 0

    def tight(self) -> bool:
        return self.rng.random() < TIGHT_SHARE

    def step(self, url: str, tpot_s: float) -> LoadSnapshot:
        k = self.rng.randrange(self.total)
        classes, slo = next((classes, s) for classes in self.streams.values()
                            for s, count in classes.items() if (k := k - count) < 0)  # fmt: skip
        classes[slo] -= 1
        to = self.streams[url]
        to[tpot_s] = to.get(tpot_s, 0) + 1
        self.steps += 1
        if self.steps % self.refit_every == 0:  # as the learner hands routing new predictions
            # (None: an older tree's, which did not do it)
            told = getattr(learned, "remember_outlooks", None)
            before = {} if told is None else {
                u: _remembering(pred) for u, pred in self.snap.curves.items()
            }  # fmt: skip
            _forget(self.snap, limits=True)
            warm = getattr(learned, "remember_limits", None)
            peaks = getattr(learned, "remember_peaks", None)
            flying = {s for c in self.streams.values() for s, k in c.items() if k}
            for pred in self.snap.curves.values():
                if warm is not None:
                    warm(pred, flying)
                if peaks is not None:
                    peaks(pred, flying)
            if told is not None:
                for u, old in before.items():
                    told(self.snap.curves[u], old)
        loads = {}
        for u, c in self.streams.items():
            n = sum(c.values())
            slos = tuple(sorted((s, k) for s, k in c.items() if k))
            loads[u] = BackendLoad(running=n, inflight=n, slos=slos)
        base = self.snap
        self.snap = LoadSnapshot(
            base.backends, loads, 0.0, base.curves, distinct=True, tiers=base.tiers
        )  # as the registry builds them
        return self.snap


def _pct(sorted_ns: Sequence[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q / 100))] / 1000


def one_pass(
    policy: Policy, snap: LoadSnapshot, scene: str, seed: int, per_round: int
) -> list[int]:
    """`per_round` timed decisions of `policy` in `scene` from the same start (`seed` draws
    the same requests, moves and choices every time), each one's ns."""
    slo = Slo()
    req = RouteRequest(_MODEL, stream=True, slo=slo)
    tight = RouteRequest(_MODEL, stream=True, slo=Slo(tpot_s=0.012))
    rng, state = random.Random(seed), RouterState()
    clock = time.perf_counter_ns
    out: list[int] = []
    _forget(snap, limits=True)  # each policy, and each replay, from the same start
    if scene == "moving":  # the 25 ms requests timed, the 12 ms ones not
        moving, now = Moving(snap, seed), snap
        while len(out) < per_round:
            if moving.tight():
                decision = policy(tight, now, state, rng)
                now = moving.step(decision.candidates[0].url, tight.slo.tpot_s)
                state = decision.state
                continue
            t0 = clock()
            decision = policy(req, now, state, rng)
            out.append(clock() - t0)
            state = decision.state
            now = moving.step(decision.candidates[0].url, slo.tpot_s)
        return out
    cold = scene == "cold"
    for _ in range(per_round):
        if cold:
            _forget(snap, limits=False)
        t0 = clock()
        state = policy(req, snap, state, rng).state
        out.append(clock() - t0)
    return out


# Work of a fixed cost, timed as a decision is: how far this machine alone spreads the times
# of identical work (a decision's 99th percentile carries that spread too).
_STEADY = tuple(float(i) for i in range(400))


def _steady(values: tuple[float, ...] = _STEADY) -> float:
    total = 0.0
    for v in values:
        total += v * v
    return total


def _machine(calls: int) -> list[int]:
    clock, out = time.perf_counter_ns, []
    for _ in range(calls):
        t0 = clock()
        _steady()
        out.append(clock() - t0)
    return out


def _cost(ns: list[int]) -> dict[str, Any]:
    ns.sort()
    return {"samples": len(ns), "p50_us": _pct(ns, 50), "p99_us": _pct(ns, 99),
            "mean_us": statistics.fmean(ns) / 1000}  # fmt: skip


Samples = dict[tuple[str, int], list[int]]  # ns per decision, by (policy, snapshot size)


def one_run(
    policies: Sequence[str], rounds: int, per_round: int, sizes: Sequence[int], scene: str
) -> tuple[Samples, list[int]]:
    """Each decision's time (ns) per policy and snapshot size over rounds x per_round calls in
    one of `SCENES`, the policies' order rotating per round (so neither always runs on a warmer
    cache); and as many timings of a fixed piece of work. The same decisions, in the same order,
    every time it is called with the same arguments."""
    if scene not in SCENES:
        raise ValueError(f"unknown scene {scene!r}; choose from {', '.join(SCENES)}")
    params = PolicyParams()
    built = {name: build_policy(name, params) for name in policies}
    snaps = {size: snapshot(size) for size in sizes}
    samples: Samples = {(p, s): [] for p in policies for s in sizes}
    steady: list[int] = []
    # As the gateway does once started (gateway.serve.server.run_server): what lives for the whole
    # run is kept out of the collector's passes.
    gc.collect()
    gc.freeze()
    try:
        for r in range(rounds):
            order = list(policies[r % len(policies) :]) + list(policies[: r % len(policies)])
            for size, snap in snaps.items():
                for name in order:
                    samples[(name, size)] += one_pass(built[name], snap, scene, r, per_round)
            steady += _machine(per_round)
    finally:
        gc.unfreeze()  # the caller's process collects as before
    return samples, steady


def _least(best: Samples, again: Samples) -> None:
    """Each decision's least time so far, in `best`."""
    for k, ns in again.items():
        best[k] = list(map(min, best[k], ns))


def _report(
    scene: str, rounds: int, sizes: Sequence[int], timed: tuple[Samples, list[int]],
    least: Samples | None,
) -> dict[str, Any]:  # fmt: skip
    """One scene's percentiles: each decision's first time (`timed`, with the fixed work's
    times), and its least where it was replayed."""
    once, steady = timed
    result: dict[str, Any] = {}
    for (name, size), ns in once.items():
        cell = _cost(list(ns))
        if least is not None:
            cell["least"] = _cost(list(least[(name, size)]))
        result.setdefault(name, {})[str(size)] = cell
    return {"inflight": _INFLIGHT, "rounds": rounds, "sizes": list(sizes), "scene": scene,
            "policies": result, "steady": _cost(list(steady))}  # fmt: skip


ROUNDS = 5  # per run of a scene, the policies' order rotated in each


def decision_alone(
    policies: Sequence[str], rounds: int = ROUNDS, per_round: int = 20_000,
    sizes: Sequence[int] = SIZES, scene: str = "fixed", replays: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """p50/p99 (µs) per policy and snapshot size over rounds x per_round calls in one of
    `SCENES` (`one_run`).

    With `replays` > 1 the decisions are made that many times over, the same ones from the
    same start, and `least` holds the percentiles of each decision's least time: its own cost,
    without what else the machine did meanwhile (an interrupt, another process on the core).
    `steady` times a fixed piece of work as often, the same way: the spread of identical work
    on this machine."""
    timed = one_run(policies, rounds, per_round, sizes, scene)
    least = dict(timed[0])
    for _ in range(replays - 1):
        _least(least, one_run(policies, rounds, per_round, sizes, scene)[0])
    report = _report(scene, rounds, sizes, timed, least if replays > 1 else None)
    return {**report, "replays": replays}


# The goals of one decision alone (µs at the 99th percentile), by backends in the snapshot.
GOALS_P99_US: Final = {3: 20.0, 16: 40.0}


T = TypeVar("T")
Measure = Callable[[Sequence[str], int, int, Sequence[int], str], tuple[Samples, list[int]]]


class FreshProcesses:
    """`one_run` in a process of its own each time, started afresh (spawned: nothing inherited
    but the environment), one at a time. Where a process's memory lies, and on a shared
    machine how fast its CPU runs for a while, move one process's timings by several percent
    or more (docs/results/decision-cost-one-pass, decision-cost-compiled): runs in one process
    share its draw, runs in fresh processes each get their own."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(1, mp_context=context, max_tasks_per_child=1)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a new process (`fn` and the arguments picklable)."""
        return self.pool.submit(fn, *args).result()

    def __call__(self, policies: Sequence[str], rounds: int, per_round: int,
                 sizes: Sequence[int], scene: str) -> tuple[Samples, list[int]]:  # fmt: skip
        return self.call(one_run, policies, rounds, per_round, sizes, scene)

    def __enter__(self) -> FreshProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(cancel_futures=True)


def repeated(
    policies: Sequence[str], runs: int, per_round: int, progress: Callable[[int], None],
    replays: int = 1, measure: Measure = one_run,
) -> dict[str, Any]:  # fmt: skip
    """`one_run` in every scene, `runs` times over (`progress(done)` after each), each by
    `measure` (in this process, or `FreshProcesses`): one run's percentiles move with what
    else the machine does, so a figure is the median of the runs', with each run's beside it.
    With `replays` > 1 every run of every scene is made that many times, a whole pass of them
    after another, so that a decision's replays lie minutes apart (a machine that slows for a
    while slows them all only if it is slow throughout); the same decisions each time, in
    whichever process."""
    once: dict[tuple[int, str], tuple[Samples, list[int]]] = {}
    least: dict[tuple[int, str], Samples] = {}
    done = 0
    for replay in range(replays):
        for i in range(runs):
            for scene in SCENES:
                samples, steady = measure(policies, ROUNDS, per_round, SIZES, scene)
                if replay == 0:
                    once[(i, scene)] = samples, steady
                    least[(i, scene)] = dict(samples)
                else:
                    _least(least[(i, scene)], samples)
                done += 1
                progress(done)
    each: list[dict[str, Any]] = []
    for i in range(runs):
        run = {}
        for scene in SCENES:
            replayed = least[(i, scene)] if replays > 1 else None
            report = _report(scene, ROUNDS, SIZES, once[(i, scene)], replayed)
            run[scene] = {**report, "replays": replays}
        each.append(run)

    def spread(cells: list[dict[str, Any]]) -> dict[str, Any]:
        return {f"{q}_us": {"median": statistics.median(c[f"{q}_us"] for c in cells),
                            "runs": [c[f"{q}_us"] for c in cells]}
                for q in ("p50", "p99")}  # fmt: skip

    summary: dict[str, Any] = {}
    for scene in SCENES:
        for name in policies:
            for size in (str(s) for s in SIZES):
                cells = [r[scene]["policies"][name][size] for r in each]
                cell = {"samples": sum(c["samples"] for c in cells), **spread(cells)}
                if replays > 1:
                    cell["least"] = spread([c["least"] for c in cells])
                summary.setdefault(scene, {}).setdefault(name, {})[size] = cell
    steady_all = spread([r[scene]["steady"] for r in each for scene in SCENES])
    return {"inflight": _INFLIGHT, "refit_every": REFIT_EVERY, "replays": replays, "runs": each,
            "summary": summary, "steady": steady_all,
            "fresh_processes": isinstance(measure, FreshProcesses)}  # fmt: skip


def goal_lines(report: dict[str, Any], policy: str = "learned") -> list[str]:
    """One line per scene and snapshot size: the goal, the median p99 of the runs, every run's,
    and the verdict (NOT MET first: a goal is met only if every run met it); then, where the
    decisions were replayed, the same for each decision's least time."""
    lines = []
    for least in (False, True):
        for scene in SCENES:
            for size, goal in sorted(GOALS_P99_US.items(), key=lambda kv: kv[0]):
                cell = report["summary"][scene][policy][str(size)]
                if least:
                    if "least" not in cell:
                        continue
                    cell = cell["least"]
                p99 = cell["p99_us"]
                worst = max(p99["runs"])
                verdict = (
                    "MET"
                    if worst <= goal
                    else (
                        "NOT MET"
                        if p99["median"] > goal
                        else "met in the median run, not in every run"
                    )
                )
                runs = ", ".join(f"{v:.1f}" for v in p99["runs"])
                what = (f"each decision's least of {report['replays']} replays" if least
                        else "as timed once")  # fmt: skip
                lines.append(f"{scene}, {policy}, {size} backends, {what}: p99 "
                             f"{p99['median']:.1f} µs (median of {len(p99['runs'])} runs; "
                             f"each: {runs}), goal <= {goal:g} µs: {verdict}")  # fmt: skip
    return lines


def routing_build() -> str:
    """Which build of the routing modules this process timed (gateway.routing.native)."""
    if Path(learned.__file__ or "").suffix == ".py":
        return "source (interpreted)"
    return "compiled with mypyc (gateway.routing.native)"


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: the goals, the machine's own spread, then p50/p99 per scene,
    policy and size, every run's."""
    summary, rev = report["summary"], report["revision"]
    code = f"commit {rev['commit']}" + (
        f" with uncommitted changes to {', '.join(rev['modified'])}" if rev["modified"] else ""
    )
    replays = report["replays"]
    replayed = (
        ""
        if replays < 2
        else f" Every run of every scene was made {replays} times, the same decisions from the "
        "same start, a whole pass of the runs after another (so a decision's replays lie "
        "minutes apart): a decision's least time is its own cost, without what else the "
        "machine did meanwhile; 'as timed once' is the first pass."
    )
    steady = report["steady"]
    m50, m99 = steady["p50_us"]["median"], steady["p99_us"]["median"]
    out = [
        "# The cost of one routing decision, alone",
        "",
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}. Code: {code}. Machine: {report['machine']}, "
        f"{report['nproc']} CPUs. Routing modules: {report.get('build', 'source')}.  ",
        f"Each policy called in a loop on a snapshot with {report['inflight']} requests in "
        "flight and the latency model's predictions in it, one per backend "
        "(loadtests.decision_cost), with 3 and 16 backends, in three scenes: `moving` (requests "
        "of both classes, a quarter 12 ms, whose decisions are not timed; after each decision "
        "a stream ends at random and the request's starts where the decision sent it; the "
        f"predictions refitted every {report['refit_every']} decisions, "
        "forgetting what they remembered), `fixed` (one snapshot: every outlook remembered "
        "after the first decision) and `cold` (one snapshot, every outlook forgotten before "
        f"each decision). Each run is {ROUNDS} rounds per scene whose policy order rotates, after "
        "`gc.freeze()` as the gateway's process does"
        + (", each run of each scene (and each replay of it) in a process of its own, started "
           "afresh" if report.get("fresh_processes") else ", all in one process")
        + ". A run's 99th percentile moves with what "
        "else the machine does: the figures are the median of the runs, each run's beside it."
        + replayed,
        "",
        f"This machine's own spread: a fixed piece of work timed the same way took p50 "
        f"{m50:.2f} µs, p99 {m99:.2f} µs ({m99 / m50:.2f}x the p50; median of the runs), "
        "identical work every time.",
        "",
        "## Goals",
        "",
        *[f"- {line}" for line in goal_lines(report)],
        "",
        "## Every policy (µs)",
        "",
        "| scene | policy | backends | samples | p50 median | p50 per run | p99 median | "
        "p99 per run |" + (" least p50 | least p99 per run |" if replays > 1 else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if replays > 1 else ""),
    ]
    for scene, by_policy in summary.items():
        for name, by_size in by_policy.items():
            for size, c in by_size.items():
                p50, p99 = c["p50_us"], c["p99_us"]
                row = (f"| {scene} | {name} | {size} | {c['samples']} | {p50['median']:.1f} | "
                       f"{' / '.join(f'{v:.1f}' for v in p50['runs'])} | {p99['median']:.1f} | "
                       f"{' / '.join(f'{v:.1f}' for v in p99['runs'])} |")  # fmt: skip
                if "least" in c:
                    lo50, lo99 = c["least"]["p50_us"], c["least"]["p99_us"]
                    row += (
                        f" {lo50['median']:.1f} | {' / '.join(f'{v:.1f}' for v in lo99['runs'])} |"
                    )
                out.append(row)
    return "\n".join(out) + "\n"


# -- the command ------------------------------------------------------------------------------


def still_bar(console: Console) -> Progress:
    """A progress bar drawn only when told (`update(..., refresh=True)`), from the timing
    thread, between runs. rich's default redraws it ten times a second from a thread of its
    own, which takes the interpreter's lock while decisions are timed: on a 2-CPU machine that
    doubled the `moving` scene's p99 as timed once with 16 backends (31-33 µs without it,
    70-81 with it; its p50 and the least times did not move: docs/results/decision-cost-bar)."""
    return Progress(console=console, auto_refresh=False)


def command(
    runs: Annotated[int, typer.Option(min=1, help="Whole measurements, one after another.")] = 3,
    calls: Annotated[
        int,
        typer.Option(
            min=5,
            help="Calls per run, scene, policy and snapshot size (3 and 16 backends), over 5 "
            "rounds.",
        ),
    ] = 100_000,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="Policies to time (default: learned, golden-range, least-loaded, power-of-two)."
        ),
    ] = None,
    replays: Annotated[
        int,
        typer.Option(
            min=1,
            help="Times every run of every scene is made, the same decisions from the same "
            "start, a whole pass of the runs after another: each decision's least time is "
            "reported beside its first (its own cost, without what else the machine did "
            "meanwhile). 1: timed once.",
        ),
    ] = 3,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh-processes/--one-process",
            help="Each run of each scene (and each replay of it) in a process of its own, "
            "started afresh, or all in this one: a process's memory layout, and on a shared "
            "machine its CPU's speed for a while, move all its timings together.",
        ),
    ] = True,
    out: Annotated[Path | None, typer.Option(help="Folder for decision-cost.md/.json.")] = None,
) -> None:
    """The CPU cost of one routing decision alone, per policy, with 3 and 16 backends: each
    policy called in a loop on a snapshot that moves as a gateway's under load does, on one
    that stays fixed (what predictions remember is reused) and on one whose predictions forget
    before each decision, `runs` times over; medians and every run's p50/p99, against the
    goals (learned: p99 <= 20 µs with 3 backends, <= 40 µs with 16), as timed once and as
    each decision's least time over `replays`; and how far the machine alone spreads the
    times of identical work."""
    import json

    from gateway.routing import POLICY_NAMES
    from loadtests.common.report import run_header

    names = tuple(policy or ("learned", "golden-range", "least-loaded", "power-of-two"))
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICY_NAMES)}"
        )
    if "learned" not in names:
        names = ("learned", *names)  # the goals are the learned policy's
    console = Console()
    with still_bar(console) as bar, contextlib.ExitStack() as stack:
        task = bar.add_task("timing decisions", total=runs * len(SCENES) * replays)
        measure = stack.enter_context(FreshProcesses()) if fresh else one_run
        report = repeated(
            names,
            runs,
            max(1, calls // 5),
            lambda done: bar.update(task, completed=done, refresh=True),
            replays,
            measure,
        )
    options = {"runs": runs, "calls": calls, "replays": replays, "policy": list(names),
               "fresh_processes": fresh}  # fmt: skip
    flags = f"--runs {runs} --calls {calls} --replays {replays}" + "".join(
        f" --policy {n}" for n in names
    ) + ("" if fresh else " --one-process")
    header = run_header(f"tiergate bench decision-cost {flags}", options, ())
    report = {**header, "revision": revision(("gateway", "loadtests/decision_cost.py")),
              "build": routing_build(), **report}  # fmt: skip
    text = markdown(report)
    console.print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "decision-cost.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "decision-cost.md").write_text(text)
        console.print(f"wrote decision-cost.md/.json to {out}")
