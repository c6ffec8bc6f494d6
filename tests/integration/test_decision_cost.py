"""The decision-cost bench's runs in fresh processes: each in a process of its own, timing the
same calls as one in this process would."""

from __future__ import annotations

import os

from loadtests import decision_cost
from loadtests.decision_cost import FreshProcesses, one_run, repeated


def test_each_run_is_made_in_a_new_process() -> None:
    with FreshProcesses() as fresh:
        pids = [fresh.call(os.getpid) for _ in range(3)]
    assert len(set(pids)) == 3
    assert os.getpid() not in pids


def test_a_fresh_process_times_the_same_calls() -> None:
    args = (("learned",), 1, 40, (3,), "moving")
    with FreshProcesses() as fresh:
        there, _ = fresh(*args)
    here, _ = one_run(*args)
    assert set(there) == set(here) == {("learned", 3)}
    assert len(there[("learned", 3)]) == len(here[("learned", 3)]) == 40


def test_the_report_says_how_its_runs_were_made() -> None:
    with FreshProcesses() as fresh:
        report = repeated(("least-loaded",), 1, 5, lambda done: None, 1, fresh)
    assert report["fresh_processes"] is True
    assert set(report["summary"]) == set(decision_cost.SCENES)
    assert repeated(("least-loaded",), 1, 5, lambda done: None)["fresh_processes"] is False
