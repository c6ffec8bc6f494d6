"""The HPA controller on a virtual clock (loadtests.autoscale.hpa), by cases worked out from
Kubernetes' documented algorithm: the proposal and its tolerance, the stabilisation windows,
the rate policies (defaults and the tutorial's), min and max."""

from __future__ import annotations

import pytest

from loadtests.autoscale.hpa import DEFAULT_DOWN, Hpa, Policy, Rules

# The tutorial's HPA (deploy/k8s/hpa.yaml): up at once, 2 pods a minute at most; down after a
# 90-s window, 1 pod a minute.
TUTORIAL_UP = Rules(0.0, (Policy("Pods", 2, 60.0),))
TUTORIAL_DOWN = Rules(90.0, (Policy("Pods", 1, 60.0),))


@pytest.mark.parametrize(
    ("case", "current", "ratios", "want"),
    [
        ("90% used of a 75% target, 50 pods: 60", 50, [90 / 75], 60),
        ("within the tolerance: unchanged", 50, [1.08], 50),
        ("just past it", 10, [1.11], 12),
        ("half the target: half the pods", 10, [0.5], 5),
        ("several metrics: the largest proposal", 4, [0.5, 1.5, 1.2], 6),
        ("no metric: unchanged", 3, [], 3),
    ],
)
def test_the_metrics_proposal(case: str, current: int, ratios: list[float], want: int) -> None:
    assert Hpa(1, 100).propose(current, ratios) == want, case


def run(hpa: Hpa, current: int, syncs: list[tuple[float, float]]) -> list[int]:
    """Replicas after each (time, ratio) sync, the controller's changes applied at once."""
    out = []
    for now, ratio in syncs:
        current = hpa.step(now, current, [ratio])
        out.append(current)
    return out


def test_default_scale_up_adds_the_more_of_double_and_four_pods_per_15_s() -> None:
    # 1 pod at 10x its target wants 10: 100% gives 2, 4 pods gives 5: 5. Within 15 s of that,
    # nothing more (the period started at 1); after it, 5 -> 10 (100%: 10, 4 pods: 9).
    hpa = Hpa(1, 20)
    assert run(hpa, 1, [(0.0, 10.0), (10.0, 2.0), (16.0, 2.0)]) == [5, 5, 10]


def test_default_scale_down_waits_out_five_minutes_of_higher_proposals() -> None:
    hpa = Hpa(1, 20)
    # 10 pods at target, then at a fifth of it from 60 s: held at 10 while the t=0 proposal
    # (10) is in the 300-s window, then down to 2 at once (100% per 15 s allows it all).
    got = run(hpa, 10, [(0.0, 1.0), (60.0, 0.2), (299.0, 0.2), (301.0, 0.2)])
    assert got == [10, 10, 10, 2]


def test_the_tutorials_behaviour_steps_two_up_and_one_down_per_minute() -> None:
    hpa = Hpa(2, 10, up=TUTORIAL_UP, down=TUTORIAL_DOWN)
    up = run(hpa, 2, [(0.0, 5.0), (30.0, 2.5), (61.0, 2.5), (122.0, 1.7)])
    # 2 wants 10: +2 -> 4; at 30 s the minute's 2 are spent; at 61 s +2 -> 6 (wants 15, max 10
    # later); at 122 s +2 -> 8.
    assert up == [4, 4, 6, 8]
    down = run(hpa, 8, [(200.0, 0.25), (250.0, 0.25), (291.0, 0.25), (320.0, 0.25),
                        (352.0, 0.25)])  # fmt: skip
    # 8 wants 2: the 90-s window holds the 122-s proposal (11) until 212 s;
    # then 1 pod a minute: 7 at 250 s, nothing more until 310 s, 6 at 320 s, nothing at 352 s.
    assert down == [8, 7, 7, 6, 6]


def test_min_and_max_bound_everything() -> None:
    hpa = Hpa(2, 4, down=Rules(0.0, DEFAULT_DOWN.policies))
    assert run(hpa, 3, [(0.0, 10.0), (100.0, 0.01)]) == [4, 2]
    assert Hpa(2, 4).step(0.0, 1, []) == 2  # below the minimum: up to it


def test_disabled_scale_down_never_removes() -> None:
    hpa = Hpa(1, 10, down=Rules(0.0, DEFAULT_DOWN.policies, select="Disabled"))
    assert run(hpa, 5, [(0.0, 0.1), (1000.0, 0.1)]) == [5, 5]


def test_the_min_policy_takes_the_smallest_change() -> None:
    up = Rules(0.0, (Policy("Percent", 100, 15.0), Policy("Pods", 4, 15.0)), select="Min")
    down = Rules(0.0, (Policy("Percent", 50, 15.0), Policy("Pods", 1, 15.0)), select="Min")
    # Up from 1 wanting 10: 100% gives 2, 4 pods 5; Min: 2. Down from 10 wanting 1: 50% leaves
    # 5, 1 pod leaves 9; Min: 9.
    assert Hpa(1, 20, up=up).step(0.0, 1, [10.0]) == 2
    assert Hpa(1, 20, down=down).step(0.0, 10, [0.1]) == 9
