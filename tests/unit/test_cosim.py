"""The routing co-simulation (loadtests.routing_sim.cosim) and its study
(loadtests.routing_sim.study), on small
deterministic runs: every request accounted for, the policies' placements as they promise, the
acceptance shift reaching the engine and the latency model, the same seed giving the same run,
and the command end to end on a tiny matrix."""

from __future__ import annotations

import io
import json
import statistics
import threading
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from engines.sim.profile import load_profile
from gateway.routing import (
    BackendLoad,
    LoadSnapshot,
    PolicyParams,
    Reason,
    Role,
    Slo,
    build_policy,
    learned,
)
from loadtests import decision_cost
from loadtests.decision_cost import decision_alone, snapshot
from loadtests.routing_sim import study
from loadtests.routing_sim.cosim import RunSpec, simulate
from loadtests.routing_sim.study import (
    DEPLOYMENTS,
    ORACLE_LIMITS,
    SLO_CLASSES,
    Options,
    arms,
    cells_of,
    converged_after,
    oracle_arm,
    settled_at,
    true_tpot,
    verdict,
)
from tiergate.cli import app

STANDARD = Slo(1.0, 0.025)
SMALL = (2, 8, 3)


def spec(policy: str = "learned", **kw: object) -> RunSpec:
    base: dict[str, object] = {
        "latency": ("v4",), "throughput": ("v3", "v3"), "users": SMALL, "phase_s": 4.0,
        "slo": STANDARD, "policy": policy,
    }  # fmt: skip
    return RunSpec(**{**base, **kw})  # type: ignore[arg-type]


def test_every_request_sent_finishes_and_leaves_nothing_in_flight() -> None:
    r = simulate(spec())
    assert r.sent == len(r.done) > 20
    assert r.inflight_left == 0
    assert r.ejections == 0
    assert sum(r.reasons.values()) == r.sent
    counted = [d for d in r.done if d.phase is not None]
    assert {d.phase for d in counted} == {0, 1, 2}
    # Users only stop after their request: the drained ones finished after the last phase.
    assert 0 < len(r.done) - len(counted) <= max(SMALL)
    assert all(d.ttft > 0.1 and 0 < d.tpot < 0.05 for d in r.done)  # a front end, then tokens
    assert len(r.decision_ns) == len(r.decision_inflight) == r.sent


def test_throughput_only_never_uses_the_latency_engine() -> None:
    r = simulate(spec("throughput-only", users=(12, 24)))
    assert r.done
    assert {d.role for d in r.done} == {Role.THROUGHPUT}
    assert set(r.reasons) == {Reason.PREFERRED_TIER}


@pytest.mark.parametrize("limit", [1, 4])
def test_an_oracle_limit_caps_the_latency_tier(limit: int) -> None:
    arm = oracle_arm(limit)
    r = simulate(spec(arm.policy, params=arm.params, users=(16, 32), trace=True))
    assert max(p.inflight for p in r.trace) == limit
    assert {d.role for d in r.done} == {Role.LATENCY, Role.THROUGHPUT}


def test_the_oracle_sweep_spans_golden_range_like_limits() -> None:
    labels = {a.label: a for a in arms()}
    assert {"learned", "golden-range", "least-loaded"} <= set(labels)
    default = PolicyParams()
    swept = {a.limit for a in labels.values() if a.limit is not None}
    assert swept == set(ORACLE_LIMITS)
    # The default golden range and hard cap are among the limits tried.
    assert {default.latency_max_concurrency, default.latency_hard_cap} <= swept
    assert labels["L=0"].policy == "throughput-only"
    sixteen = labels["L=16"].params
    assert (sixteen.latency_max_concurrency, sixteen.latency_hard_cap, sixteen.hysteresis) == (
        16, 16, 0)  # fmt: skip


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    a, b, c = simulate(spec(seed=3)), simulate(spec(seed=3)), simulate(spec(seed=4))
    assert a.done == b.done
    assert a.reasons == b.reasons
    assert a.curves == b.curves
    assert a.done != c.done


def test_an_acceptance_shift_reaches_the_engine_and_the_model() -> None:
    low = load_profile("v4-low").speculative
    assert low is not None
    r = simulate(spec(users=(32,) * 4, shifts=((4.0, low.acceptance),), trace=True))
    before = [p.tokens_per_step for p in r.trace if 3.0 <= p.t < 4.0]
    after = [p.tokens_per_step for p in r.trace if 7.0 <= p.t < 8.0]
    assert min(before) > 2.8  # v4: 3.26 tokens per step
    assert max(after) < 2.2  # v4-low: 1.67, the 3 s half-life still carrying some of v4's
    tpot_after = [p.tpot_at for p in r.trace if 7.0 <= p.t < 8.0]
    assert min(tpot_after) > 1.4 * min(p.tpot_at for p in r.trace if 3.0 <= p.t < 4.0)


def test_the_learned_latency_curve_approaches_the_truth_where_it_ran() -> None:
    r = simulate(spec(users=(8,) * 3))
    (lat,) = [u for u, role in r.roles.items() if role is Role.LATENCY]
    learned, evidence = r.curves[lat][8 - 1]
    assert evidence > 0.5
    assert learned == pytest.approx(true_tpot("v4", 8), rel=0.25)


def test_verdicts_and_convergence() -> None:
    assert verdict(100, 100, 95)["text"] == "MET"
    assert verdict(90, 100, 95)["text"] == "within noise"  # noise 2 sqrt(190) = 27.6
    assert verdict(60, 100, 95)["text"] == "NOT MET"
    trace = [{"t": t, "tpot_at": v} for t, v in [(1, 5.0), (2, 9.0), (3, 10.5), (4, 8.0),
                                                    (5, 10.2), (6, 9.9)]]  # fmt: skip
    assert converged_after(trace, 2.0, 10.0) == 3.0
    assert converged_after(trace[:4], 2.0, 10.0) is None


def test_the_command_writes_the_report(tmp_path: Path) -> None:
    args = ["bench", "routing-sim", "--phase-seconds", "1", "--seeds", "1", "--deployment",
            "tutorial", "--shape", "burst", "--slo", "interactive", "--jobs", "1",
            "--decision-calls", "500", "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"routing-sim.md", "routing-sim.json", "routing-sim.png",
                     "learned-shift.png", "learned-curves.png"}  # fmt: skip
    report = json.loads((tmp_path / "routing-sim.json").read_text())
    (cell,) = report["cells"]
    assert (cell["deployment"], cell["shape"], cell["slo"]) == ("tutorial", "burst", "interactive")
    assert cell["oracle"]["limit"] in ORACLE_LIMITS
    assert cell["vs_oracle"]["text"] in ("MET", "within noise", "NOT MET")
    assert report["conservation"] == {"inflight_left": 0, "ejections": 0}
    alone = report["decision_alone"]
    assert alone["inflight"] == 64
    assert set(alone["policies"]) == {"learned", "golden-range", "least-loaded"}
    for by_size in alone["policies"].values():
        assert set(by_size) == {"3", "16"}
        for cost in by_size.values():
            assert 0 < cost["p50_us"] <= cost["p99_us"]
            assert cost["samples"] == 500
    md = (tmp_path / "routing-sim.md").read_text()
    assert "`learned` alone, 16 backends: p50" in md
    assert ("--deployment tutorial --shape burst --slo interactive --decision-calls 500 --out DIR"
            in md)
    assert str(tmp_path) not in md


def test_the_command_refuses_an_unknown_deployment() -> None:
    result = CliRunner().invoke(app, ["bench", "routing-sim", "--deployment", "nope"])
    assert result.exit_code == 2  # a usage error, before anything runs
    assert "unknown deployment nope" in result.output


def test_the_decision_snapshot_is_the_stated_load() -> None:
    snap = snapshot(3)
    assert sum(snap.load(b.url).effective for b in snap.backends) == 64
    assert [b.role for b in snap.backends] == [Role.LATENCY, Role.THROUGHPUT, Role.THROUGHPUT]
    assert all(snap.curves[b.url].known for b in snap.backends)  # the learned policy reads them
    wide = snapshot(16)
    assert sum(wide.load(b.url).effective for b in wide.backends) == 64
    assert [b.role for b in wide.backends].count(Role.LATENCY) == 2
    cost = decision_alone(("learned", "golden-range"), rounds=2, per_round=50)
    assert {name: {size: c["samples"] for size, c in by_size.items()}
            for name, by_size in cost["policies"].items()} == {
        "learned": {"3": 100, "16": 100},
        "golden-range": {"3": 100, "16": 100},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("mine", "theirs", "settled"),
    [
        ([100, 100, 100], [100, 100, 100], 0.0),
        ([10, 100, 100], [100, 100, 100], 10.0),  # short of 95% by more than the noise at first
        ([100, 10, 100], [100, 100, 100], 20.0),  # ... falling behind later starts again
        ([100, 100, 10], [100, 100, 100], None),  # behind in the last window: never
        ([90, 90, 90], [100, 100, 100], 0.0),  # 95 - 2 sqrt(190) = 67: within the noise
    ],
)
def test_when_learned_settles_against_the_oracle(
    mine: list[int], theirs: list[int], settled: float | None
) -> None:
    assert settled_at(mine, theirs, 0.95) == settled


def test_each_deployment_runs_its_own_slo_classes() -> None:
    opts = Options(deployments=("tutorial", "knee-64"), shapes=("step",))
    assert cells_of(opts) == [("tutorial", "step", "interactive"), ("tutorial", "step", "standard"),
                              ("knee-64", "step", "tight"), ("knee-64", "step", "standard")]
    only = Options(deployments=("tutorial", "knee-64"), shapes=("step",), slos=("standard",))
    assert [c[0] for c in cells_of(only)] == ["tutorial", "knee-64"]
    for name, d in DEPLOYMENTS.items():
        assert set(d.slos) <= set(SLO_CLASSES), name
        for profile in (*d.latency, *d.throughput):
            load_profile(profile)  # every profile exists
    assert "power-of-two" in {a.policy for a in arms()}


def test_a_latency_tier_of_two_engines_uses_both() -> None:
    r = simulate(spec(latency=("v4", "v4"), users=(24,) * 2))
    latency = [u for u, role in r.roles.items() if role is Role.LATENCY]
    assert latency == ["http://latency-0.sim", "http://latency-1.sim"]
    assert all(r.phase_load[1][u] > 1 for u in latency)
    assert r.inflight_left == 0


@pytest.mark.parametrize(
    ("p99_runs", "verdict"),
    [
        ([10.0, 12.0, 19.0], "MET"),
        ([10.0, 12.0, 25.0], "met in the median run, not in every run"),
        ([21.0, 30.0, 12.0], "NOT MET"),
    ],
)
def test_a_decision_goal_is_met_only_in_every_run(p99_runs: list[float], verdict: str) -> None:
    def cell(runs: list[float]) -> dict[str, object]:
        return {"p99_us": {"median": statistics.median(runs), "runs": runs}}

    scene = {"learned": {"3": cell(p99_runs), "16": cell([1.0])}}
    report = {"summary": dict.fromkeys(decision_cost.SCENES, scene)}
    lines = decision_cost.goal_lines(report)
    assert len(lines) == 2 * len(decision_cost.SCENES)
    assert lines[0].startswith("moving, learned, 3 backends")
    assert lines[0].endswith(f"goal <= 20 µs: {verdict}")
    assert lines[1].endswith("goal <= 40 µs: MET")


def test_the_moving_scene_keeps_its_streams_and_moves_them_where_decisions_send_them() -> None:
    snap = snapshot(16)
    moving = decision_cost.Moving(snap, seed=1, refit_every=3)
    pred = snap.curves["http://backend-5:8000"]
    (watched,) = (b for b in snap.backends if b.url == "http://backend-5:8000")
    limits = learned.Learned.build("learned", PolicyParams()).limits

    def ask(k: int) -> None:  # an outlook decisions asked of it
        load = BackendLoad(running=k, inflight=k, slos=((0.025, k),))
        learned.outlook(watched, load, pred, Slo(), limits)

    ask(0)
    target = "http://backend-3:8000"

    def counts(s: LoadSnapshot) -> Counter[tuple[str, float]]:
        return Counter({(u, slo): c for u, b in s.by_url.items() for slo, c in b.slos})

    now = snap
    for i in range(1, 7):
        before, asked = counts(now), dict(pred.outlooks)
        now = moving.step(target, 0.012)
        for load in now.by_url.values():
            assert load.inflight == sum(c for _, c in load.slos)
            assert [s for s, _ in load.slos] == sorted(s for s, _ in load.slos)
        # one stream ended somewhere, the request's began on the target
        change = counts(now)
        change.subtract(before)
        change[(target, 0.012)] -= 1
        assert sorted(v for v in change.values() if v) == [-1]
        assert now.curves is snap.curves  # the same predictions, until a refit forgets
        # Every third step a refit: what was asked is forgotten and told again (computed
        # afresh, as the learner tells a new prediction); between refits it is kept as it is.
        refit = i % 3 == 0
        assert set(pred.outlooks) == set(asked)
        assert all((pred.outlooks[k] is v) != refit for k, v in asked.items())
        ask(i)
    draws = [decision_cost.Moving(snap, seed=s).tight() for s in range(400)]
    assert 0.15 < sum(draws) / len(draws) < 0.35  # a quarter of the requests are 12 ms


def test_bench_decision_cost_writes_its_runs(tmp_path: Path) -> None:
    args = ["bench", "decision-cost", "--runs", "2", "--calls", "10", "--policy", "least-loaded",
            "--one-process"]  # (each in a fresh process: tests/integration/test_decision_cost.py)
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "decision-cost.json").read_text())
    assert len(report["runs"]) == 2
    assert set(report["summary"]) == set(decision_cost.SCENES)
    for scene in decision_cost.SCENES:  # the goals' policy joins
        assert set(report["summary"][scene]) == {"learned", "least-loaded"}
    cell = report["summary"]["moving"]["least-loaded"]["16"]
    assert cell["samples"] == 20
    assert len(cell["p99_us"]["runs"]) == 2
    assert report["replays"] == 3  # each decision's least time of three passes, per run
    for q in ("p50_us", "p99_us"):
        assert all(a <= b for a, b in zip(cell["least"][q]["runs"], cell[q]["runs"], strict=True))
    assert "## Goals" in (tmp_path / "decision-cost.md").read_text()
    bad = CliRunner().invoke(app, ["bench", "decision-cost", "--policy", "nope"])
    assert bad.exit_code == 2
    assert "unknown policy nope" in bad.output


def test_decision_cost_bar_draws_from_no_thread_of_its_own() -> None:
    """The bar over timed decisions is drawn when told, by the timing thread: no thread of its
    own takes the interpreter's lock while a decision is timed."""
    out = io.StringIO()
    before = threading.active_count()
    with decision_cost.still_bar(Console(file=out, force_terminal=True, width=80)) as bar:
        task = bar.add_task("timing decisions", total=3)
        assert threading.active_count() == before
        bar.update(task, completed=2, refresh=True)
        assert "2/3" in out.getvalue() or "67%" in out.getvalue()
    assert threading.active_count() == before


@pytest.mark.parametrize(
    ("params", "at_least"),
    [
        # The defaults: a conversation on a pool engine comes up to the latency engine where
        # that adds over twice the output (after the 16-user phase, a few do).
        (PolicyParams(), 0.85),
        # Never for speed alone: every later turn home (the tiers stay before their knees).
        (PolicyParams(affinity_yield=0), 0.95),
        (PolicyParams(prefix_affinity=False), 0.0),
    ],
)
def test_conversations_go_back_where_they_were_served(
    params: PolicyParams, at_least: float
) -> None:
    """Conversations of 4 turns over a shared system prompt: with affinity (the default) later
    turns are served where their conversation's last turn was, and find it in that engine's
    prefix cache, unless they move up to the faster tier; every request is still accounted for
    either way."""
    r = simulate(spec(turns=4, system_tokens=600, users=(4, 16, 4), phase_s=6.0, params=params))
    assert r.sent == len(r.done)
    assert r.inflight_left == 0
    later = [d for d in r.done if d.turn > 0]
    assert len(later) > 40
    assert {d.turn for d in r.done} == {0, 1, 2, 3}
    stayed = sum(d.stayed for d in later) / len(later)
    assert stayed >= at_least, stayed
    if params.prefix_affinity:  # every turn that left its home went up to the latency engine
        assert all(d.role is Role.LATENCY for d in later if not d.stayed)
    # A turn served where its conversation was finds at least the system prompt and the
    # conversation's last turn cached: 600 + 50 + 256 tokens, less one partial block.
    for d in later:
        if d.stayed:
            assert d.cached >= 600 + (d.turn - 1) * 306 + 290, d
    assert all(d.cached == 0 for d in r.done if d.turn == 0 and d.at < 1.0)  # a cold start


def test_the_chat_workload_reaches_the_report() -> None:
    # (Phases long enough for a conversation's second turn to finish inside one; two fixed
    # limits only, no report files: the command's own test covers those.)
    opts = Options(phase_s=3.0, seeds=1, deployments=("little",), shapes=("burst",),
                   slos=("interactive",), limits=(0, 8), jobs=1, decision_calls=50,
                   workload="chat")  # fmt: skip
    report = study.run(opts, Console(file=io.StringIO()))
    assert report["options"]["workload"] == "chat"
    assert report["affinity"]["later_turns"] > 0
    assert report["affinity"]["share"] > 0.5  # (conversations move off a tier past its knee)
    assert "--workload chat" in report["command"]
    assert "conversations of 4 turns" in study.markdown(report)


@pytest.mark.parametrize("scene", decision_cost.SCENES)
def test_a_replay_makes_the_same_decisions_and_its_least_times_are_reported(scene: str) -> None:
    snap = snapshot(16)
    policy = build_policy("learned", PolicyParams())

    def remembered() -> dict[str, set[tuple[object, ...]]]:
        return {url: set(pred.outlooks) for url, pred in snap.curves.items()}

    decision_cost.one_pass(policy, snap, scene, seed=3, per_round=230)
    first = remembered()
    assert any(first.values())
    decision_cost.one_pass(policy, snap, scene, seed=3, per_round=230)
    assert remembered() == first  # the same decisions, so the same outlooks remembered
    cost = decision_alone(("learned",), rounds=1, per_round=60, scene=scene, replays=3)
    assert cost["replays"] == 3
    for cell in cost["policies"]["learned"].values():
        least = cell["least"]
        assert least["samples"] == cell["samples"] == 60
        assert 0 < least["p50_us"] <= cell["p50_us"]  # each decision's least of its times
        assert least["p99_us"] <= cell["p99_us"]
    assert cost["steady"]["samples"] == 60
    once = decision_alone(("learned",), rounds=1, per_round=10, scene=scene)
    assert "least" not in once["policies"]["learned"]["3"]
