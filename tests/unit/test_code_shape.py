"""Shape rules of the product code that review alone would let slip."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
MAX_PARAMS = 5  # besides self/cls: more means a request object or a config object is missing


@functools.cache  # parsed once, not once per parametrized case
def _functions() -> tuple[tuple[str, int, str, tuple[str, ...]], ...]:
    found = []
    for path in sorted(GATEWAY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                names += [f"*{v.arg}" for v in (a.vararg,) if v]
                names += [f"**{k.arg}" for k in (a.kwarg,) if k]
                names = [n for n in names if n not in ("self", "cls")]
                where = str(path.relative_to(GATEWAY.parent))
                found.append((where, node.lineno, node.name, tuple(names)))
    return tuple(found)


def test_the_walk_sees_the_gateway() -> None:
    names = {name for _, _, name, _ in _functions()}
    assert {"create_app", "forward", "admit", "read"} <= names


@pytest.mark.parametrize("where", [f"{p}:{n} {f}" for p, n, f, _ in _functions()])
def test_no_function_takes_more_than_five_parameters(where: str) -> None:
    (params,) = [a for p, n, f, a in _functions() if f"{p}:{n} {f}" == where]
    assert len(params) <= MAX_PARAMS, f"{where} takes {len(params)}: {params}"
