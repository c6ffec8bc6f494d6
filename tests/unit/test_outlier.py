"""Outlier detection (backends.outlier): the verdicts of request outcomes, on a virtual clock."""

from __future__ import annotations

import pytest

from gateway.backends.outlier import Mode, OutlierState, Verdict
from gateway.config.settings import OutlierConfig

CFG = OutlierConfig(consecutive_failures=3, failure_ratio=0.3, window_s=10, min_requests=10,
                    base_ejection_s=5, max_ejection_s=60, trial_successes=3)  # fmt: skip


def play(script: str, state: OutlierState | None = None, at: float = 0.0) -> list[str]:
    """Outcomes one every 0.1 s (o ok, f failed, a credentials refused); the verdicts that are
    not NONE, as 'eject@i' / 'readmit@i'."""
    st = state or OutlierState()
    out = []
    for i, c in enumerate(script):
        now = at + i * 0.1
        v = st.succeeded(CFG, now) if c == "o" else st.failed(CFG, now, fatal=c == "a")
        if v is not Verdict.NONE:
            out.append(f"{v.value}@{i}")
            if v is Verdict.EJECT:
                st.eject(CFG, now)
    return out


@pytest.mark.parametrize(
    ("script", "verdicts"),
    [
        ("ofof", []),
        ("offf", ["eject@3"]),  # three in a row
        ("ffoffo", []),  # never three in a row, and 6 attempts are too few for the ratio
        # half failing, never three in a row: the ratio over the window (10 attempts at least)
        ("ofofofofof", ["eject@9"]),
        ("oooooooofof", []),  # 2 of 11 failed: under 30%
        ("a", ["eject@0"]),  # the engine refused the gateway's credentials
    ],
)
def test_what_ejects(script: str, verdicts: list[str]) -> None:
    assert play(script) == verdicts


def test_the_window_forgets_old_failures() -> None:
    st = OutlierState()
    assert play("ofofofof", st) == []  # 4 of 8 failed: not enough attempts yet
    # 25 s later the old window is out of reach: 2 of 10 fails is under the ratio
    assert play("ooooooofof", st, at=25.0) == []
    ratio, total = st.failure_ratio(CFG, 25.9)
    assert total == 10
    assert ratio == pytest.approx(0.2)


def test_ejection_time_grows_with_each_ejection_and_calm_forgives() -> None:
    st = OutlierState()
    times = []
    now = 0.0
    for _ in range(3):
        times.append(st.eject(CFG, now))
        now = st.until
        assert st.tick(now)
        assert st.mode is Mode.PROBATION
        assert st.failed(CFG, now) is Verdict.EJECT  # failed its trial
    assert times == [5, 10, 15]
    st.eject(CFG, now)
    now = st.until
    st.tick(now)
    for i in range(3):
        st.succeeded(CFG, now + i)
    assert st.mode is Mode.ACTIVE
    # two max_ejection_s of calm forgive two of the four ejections: the next lasts 3 x 5 s
    assert st.eject(CFG, now + 2 + 2 * CFG.max_ejection_s) == 15


def test_ejection_time_is_capped() -> None:
    st = OutlierState(ejections=100)
    st.mode = Mode.PROBATION
    assert st.eject(CFG, 0.0) == CFG.max_ejection_s


def test_failures_of_attempts_started_before_the_ejection_change_nothing() -> None:
    st = OutlierState()
    st.eject(CFG, 0.0)
    assert st.failed(CFG, 0.1) is Verdict.NONE
    assert not st.tick(4.9)
    assert st.tick(5.0)
    assert not st.tick(5.1)  # once
