"""`tiergate bench`: one module per command, named after it, declaring its own options; the
loadtests README's table names each command and its module."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadtests.cli import COMMANDS
from tiergate.cli import app

ROOT = Path(__file__).resolve().parents[2]


def file_of(module: str) -> str:
    """The module's file or folder under loadtests/, as the README names it."""
    path = Path(*module.split("."))
    return f"{path.name}/" if (ROOT / path).is_dir() else f"{path.name}.py"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_is_a_module_named_after_it_with_its_options(name: str) -> None:
    module = COMMANDS[name]
    assert module.rsplit(".", 1)[1] == name.replace("-", "_")
    command = importlib.import_module(module).command
    assert inspect.isfunction(command)
    assert command.__module__ == module  # declared there, not in the command line's module
    done = CliRunner().invoke(app, ["bench", name, "--help"])
    assert done.exit_code == 0, done.output
    for param in inspect.signature(command).parameters:
        assert f"--{param.replace('_', '-')}" in done.output or param in ("profiles",), param


def test_the_readme_table_names_every_command_and_its_module() -> None:
    text = (ROOT / "loadtests" / "README.md").read_text()
    rows = re.findall(r"^\| `tiergate bench ([a-z-]+)` \| `([a-z_/.]+)` \|", text, re.M)
    assert sorted(rows) == sorted((c, file_of(m)) for c, m in COMMANDS.items())


def test_the_bench_help_lists_every_command() -> None:
    done = CliRunner().invoke(app, ["bench", "--help"])
    assert done.exit_code == 0, done.output
    for name in COMMANDS:
        assert name in done.output
