"""`bench autoscale` in small: an elastic deployment scaled by each arm through a short trace,
on the virtual clock (the full study: `tiergate bench autoscale`)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from loadtests.autoscale import study
from loadtests.autoscale.arms import ARMS, TutorialHpa
from loadtests.autoscale.cosim import STARTUP_S, Elastic, Scaler, Spec, simulate
from loadtests.autoscale.traces import TRACES

DEP = study.DEPLOYMENTS["tutorial"]


def spec(trace: str, arm: str, scale: float = 0.05, ceiling: float = 10.0) -> Spec:
    t = TRACES[trace]
    return Spec(DEP.latency, DEP.throughput, DEP.classes,
                replace(t, duration_s=t.duration_s * scale), ceiling, arm, seed=1)  # fmt: skip


class _Steps(Scaler):
    """Asks for 1/2, then 1/4, then 1/1 replicas (latency/pool), at 0 s, 20 s and 60 s."""

    def desired(self, sim: Elastic, now: float) -> tuple[int, int]:
        return (1, 2) if now < 20 else (1, 4) if now < 60 else (1, 1)


def test_replicas_start_late_cost_from_asked_and_leave_without_losing_a_request() -> None:
    s = replace(spec("shift", "planner", 0.1, ceiling=2.0), sync_s=10.0, startup_s=(30.0, 30.0))
    run = simulate(s, lambda sim: _Steps())
    assert run.unfinished == 0
    assert len(run.served) == run.sent
    asked = {t: a[1] for t, a, _ in run.timeline}
    serving = {t: r[1] for t, _, r in run.timeline}
    assert asked[20.0] == 4
    assert serving[20.0] == 2
    assert serving[50.0] == 4  # 30 s later, serving
    assert asked[60.0] == 1
    # GPU time, to the end of the trace or of its last request: 1 latency replica all along;
    # in the pool the oldest to the end, and the three youngest (one from 0 s, two from
    # 20 s) until 60 s, when they left, plus the streams they still had then.
    end = max(240.0, max(x.arrived + x.e2e for x in run.served))
    assert run.gpu_s[0] == pytest.approx(end)
    assert end + 60 + 2 * 40 <= run.gpu_s[1] <= end + 60 + 2 * 40 + 3 * 30


def test_every_arm_meets_the_same_requests() -> None:
    runs = {arm: simulate(spec("flash", arm, 0.03, ceiling=4.0), ARMS[arm]) for arm in ARMS}
    sent = {r.sent for r in runs.values()}
    assert len(sent) == 1
    assert sent.pop() > 100
    for r in runs.values():
        assert r.unfinished == 0
        assert len(r.served) == r.sent
        assert all(g > 0 for g in r.gpu_s)


def test_the_tutorial_hpa_targets_70_percent_of_the_ceiling_and_60_of_the_sla() -> None:
    sim = Elastic(spec("diurnal", "tutorial-hpa"), TutorialHpa)
    assert isinstance(sim.scaler, TutorialHpa)
    assert sim.scaler.rps_target == pytest.approx(7.0)
    # The standard class (25 ms) with its longest answers (1.5 x 128 tokens): 1 + 4.8 s.
    assert sim.scaler.p99_target == pytest.approx(0.6 * (1.0 + 192 * 0.025))


def test_the_study_writes_its_report(tmp_path: Path) -> None:
    opts = study.Options(traces=("flash",), seeds=1, time_scale=0.015, jobs=1, out=tmp_path)
    report = study.run(opts)
    cell = report["cells"]["tutorial/flash"]
    assert set(cell["arms"]) == set(ARMS)
    for arm in cell["arms"].values():
        (seed,) = arm["seeds"]
        assert seed["gpu_h_total"] > 0
        assert seed["timeline"]
        assert all(0 <= a <= 1 for a in seed["attainment"] if not math.isnan(a))
    assert [g["goal"].split(":")[0] for g in report["goals"]] == ["tutorial/flash"]
    assert (tmp_path / "autoscale.json").exists()
    assert (tmp_path / "autoscale.md").exists()
    assert "tutorial/flash" in (tmp_path / "autoscale.md").read_text()


@pytest.mark.parametrize(
    ("headroom", "planned", "flag"), [(None, 0.2, ""), (1.0, 1.0, " --headroom 1")]
)
def test_the_planners_headroom_is_the_settings_unless_given(
    headroom: float | None, planned: float, flag: str
) -> None:
    opts = study.Options(traces=("flash",), arms=("planner",), seeds=1, headroom=headroom)
    (task,) = study.tasks(opts, {"tutorial": 10.0})
    assert task.spec.planner.headroom == planned
    assert task.spec.planner.startup_s == STARTUP_S[1]
    assert opts.command().endswith(f"--arm planner --seeds 1{flag}")
