"""The instruction-count benchmark's reading of callgrind_control's totals, and the settings
its `--setting` baseline runs under."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from loadtests.instructions import parse_totals, payloads, with_settings
from tiergate.cli import app


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


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ((), {"policy": {"prefix_affinity": True}, "monitor": {"x": 1}}),
        (("policy.prefix_affinity=false",),
         {"policy": {"prefix_affinity": False}, "monitor": {"x": 1}}),
        (("policy.affinity_quiet_every=4", "monitor.x=2.5"),
         {"policy": {"prefix_affinity": True, "affinity_quiet_every": 4}, "monitor": {"x": 2.5}}),
        (("tracing.exporter=none",),  # a section the configuration did not have yet
         {"policy": {"prefix_affinity": True}, "monitor": {"x": 1},
          "tracing": {"exporter": "none"}}),
        ((" policy.prefix_affinity = off",),  # YAML's own reading of the value
         {"policy": {"prefix_affinity": False}, "monitor": {"x": 1}}),
    ],
)  # fmt: skip
def test_a_setting_is_set_in_a_copy_of_the_configuration(
    settings: tuple[str, ...], expected: dict[str, Any]
) -> None:
    cfg = {"policy": {"prefix_affinity": True}, "monitor": {"x": 1}}
    assert with_settings(cfg, settings) == expected
    assert cfg == {"policy": {"prefix_affinity": True}, "monitor": {"x": 1}}  # untouched


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("policy.prefix_affinity", "KEY=VALUE"),
        ("=false", "KEY=VALUE"),
        ("policy..x=1", "KEY=VALUE"),
        ("monitor.x.y=1", "x is a value"),
    ],
)
def test_a_malformed_setting_is_refused(setting: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        with_settings({"monitor": {"x": 1}}, (setting,))


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--setting", "policy.prefix_affinity=false", "--baseline", "HEAD~1"], "no --baseline"),
        (["--setting", "policy.prefix_affinity"], "KEY=VALUE"),
    ],
)
def test_the_command_refuses_a_setting_it_cannot_use_before_starting_anything(
    args: list[str], why: str
) -> None:
    # (wide, so that the message is on one line)
    done = CliRunner().invoke(app, ["bench", "instructions", *args], env={"COLUMNS": "200"})
    assert done.exit_code == 2, done.output
    assert why in done.output


def test_one_off_prompts_stay_new_from_one_kind_to_the_next() -> None:
    """Every kind a gateway process counts draws from one serial: a stream's prompt is never a
    small request's sent before (which prefix affinity would route as a repeat)."""
    serial = itertools.count()
    small = payloads({"prompt": "hello", "max_tokens": 4}, True, serial)
    stream = payloads({"prompt": "hello", "stream": True}, True, serial)
    prompts = [json.loads(next(kind))["prompt"] for kind in (small, small, stream, stream)]
    assert prompts == ["hello 00000000", "hello 00000001", "hello 00000002", "hello 00000003"]
    assert len({len(p) for p in prompts}) == 1  # only their newness differs


def test_repeated_prompts_are_one_body() -> None:
    same = payloads({"prompt": "hello"}, False, itertools.count())
    assert next(same) == next(same) == b'{"prompt": "hello"}'
