"""`tiergate bench`: the benchmarks, one module per command, named after it, that declares the
command's options (its `command` function). A command's module is imported only when the
command runs (or `--help` lists it), so `tiergate` starts without loading any bench."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperGroup

__all__ = ["COMMANDS", "bench"]

# Command -> module, in the order `tiergate bench --help` lists them.
COMMANDS: dict[str, str] = {
    "calibrate": "loadtests.calibrate",
    "tables": "loadtests.tables",
    "crossover": "loadtests.crossover",
    "routing": "loadtests.routing",
    "routing-sim": "loadtests.routing_sim",
    "autoscale": "loadtests.autoscale",
    "decision-cost": "loadtests.decision_cost",
    "overhead": "loadtests.overhead",
    "instructions": "loadtests.instructions",
    "clients": "loadtests.clients",
    "peers": "loadtests.peers",
    "affinity": "loadtests.affinity",
    "conversations": "loadtests.conversations",
    "tenants": "loadtests.tenants",
    "triton": "loadtests.triton",
    "chaos": "loadtests.chaos",
    "dashboards": "loadtests.dashboards",
}


class _Benches(TyperGroup):
    """Each command built from its module's `command` when asked for. (The context and command
    types are those of the click typer carries with it: typed Any here.)"""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        function: Callable[..., Any] = importlib.import_module(module).command
        one = typer.Typer(add_completion=False)
        one.command(cmd_name)(function)
        return typer.main.get_command(one)


bench = typer.Typer(
    cls=_Benches,
    help="Benchmarks (each prints its measurements and their sample counts).",
    no_args_is_help=True,
)
