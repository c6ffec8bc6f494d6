"""The instruction-count benchmark's reading of callgrind_control's totals."""

from __future__ import annotations

import pytest

from loadtests.instructions import parse_totals


@pytest.mark.parametrize(
    ("text", "total"),
    [
        ("  Totals:         Ir \n   Th 1  146,703,008 \n\n", 146_703_008),
        ("Totals:  Ir\n Th 1  1,000\n Th 2  2,500\n", 3_500),
        ("PID 7: python\nTotals:  Ir\n  42\n", 42),
        ("Totals: Ir\n Th 1 5\nTotals: Ir\n Th 1 9\n", 9),  # the last dump's
    ],
)
def test_totals_are_summed_over_threads(text: str, total: int) -> None:
    assert parse_totals(text) == total


def test_no_totals_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="no totals"):
        parse_totals("No active callgrind runs detected.\n")
