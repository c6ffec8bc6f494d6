"""The benches' CPU per request, its system part beside the whole: a window's charge from two
readings of (user, system), pooled rounds, and the per-round figures `bench peers` shows."""

from __future__ import annotations

import math

import pytest

from loadtests.common.stats import Cpu, Samples


def _window(n: int, before: tuple[float, float], after: tuple[float, float]) -> Samples:
    s = Samples(values=[0.001] * n)
    s.charge(before, after)
    return s


@pytest.mark.parametrize(
    ("before", "after", "cpu_s", "system_s"),
    [
        ((1.0, 0.5), (1.4, 0.6), 0.5, 0.1),  # user 0.4 + system 0.1
        ((2.0, 1.0), (2.0, 1.0), 0.0, 0.0),  # nothing used
        ((0.0, 0.0), (0.0, 0.3), 0.3, 0.3),  # all of it the system's
    ],
)
def test_a_window_is_charged_user_and_system_apart(
    before: tuple[float, float], after: tuple[float, float], cpu_s: float, system_s: float
) -> None:
    s = _window(10, before, after)
    assert s.cpu_s == pytest.approx(cpu_s)
    assert s.system_s == pytest.approx(system_s)


def test_pooled_rounds_add_both() -> None:
    a, b = _window(4, (0.0, 0.0), (0.3, 0.1)), _window(6, (1.0, 1.0), (1.2, 1.3))
    pooled = Samples.pool([a, b])
    assert pooled.cpu_s == pytest.approx(0.4 + 0.5)
    assert pooled.system_s == pytest.approx(0.1 + 0.3)


def test_cpu_per_request_and_its_system_part_per_round() -> None:
    rounds = [_window(100, (0.0, 0.0), (0.03, 0.01)), _window(200, (0.0, 0.0), (0.1, 0.02))]
    cpu = Cpu.of(rounds)
    assert cpu.rounds == pytest.approx([0.4, 0.6])  # ms a request: 40 ms / 100, 120 ms / 200
    assert cpu.system_rounds == pytest.approx([0.1, 0.1])
    assert cpu.ms_per_request == pytest.approx(0.5)


def test_a_window_without_requests_has_no_figure() -> None:
    cpu = Cpu.of([_window(0, (0.0, 0.0), (0.01, 0.01))])
    assert math.isnan(cpu.rounds[0])
    assert math.isnan(cpu.system_rounds[0])
