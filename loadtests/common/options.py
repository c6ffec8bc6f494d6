"""Options and checks the bench commands share."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import typer


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def known(names: list[str] | None, allowed: Sequence[str]) -> list[str] | None:
    """`names` if each is one of `allowed`; a usage error naming the others otherwise."""
    unknown = [n for n in names or () if n not in allowed]
    if unknown:
        choices = ", ".join(allowed)
        raise typer.BadParameter(f"unknown {', '.join(unknown)}; choose from {choices}")
    return names


def pick(names: list[str] | None, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """`names`, each one of `allowed` (all of them when none are given); a usage error naming
    the `what` that are not."""
    unknown = [n for n in names or () if n not in allowed]
    if unknown:
        raise typer.BadParameter(
            f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}"
        )
    return tuple(names) if names else allowed


def without(argv: list[str], option: str) -> list[str]:
    """`argv` without `option` and its value: a folder of this machine says nothing in a report."""
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith(f"{option}="):
            skip = False
        elif arg == option:
            skip = True
        else:
            out.append(arg)
    return out


PEERS_VENV_HELP = (
    "The peers' virtual environment (default: $TIERGATE_PEERS_VENV, else "
    "~/.cache/tiergate/peers-venv); created and filled on first use unless --no-install."
)
