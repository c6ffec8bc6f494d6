"""The `tiergate` command line: each layer's commands in one app. The layers' modules import
only typer at the top, so `tiergate sim` loads neither the gateway nor the benchmarks."""

from __future__ import annotations

import typer

from engines import cli as engines_cli
from gateway.serve import cli as gateway_cli
from loadtests import cli as loadtests_cli
from tiergate.up import up

app = typer.Typer(
    help="tiergate: an OpenAI-compatible gateway that puts each request on the LLM serving tier "
    "that answers it best right now.",
    no_args_is_help=True,
    add_completion=False,
)
app.command()(engines_cli.sim)
app.command()(engines_cli.hf)
app.command()(gateway_cli.serve)
app.command()(up)


app.add_typer(loadtests_cli.bench, name="bench")
app.add_typer(gateway_cli.keys, name="keys")


def main() -> None:
    app()
