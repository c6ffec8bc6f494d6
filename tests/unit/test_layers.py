"""The layers: the gateway imports neither the engines nor the load tests (nor the command
composed above them), and the engines import none of the others. Every module of a package is
imported in a fresh interpreter, so that nothing another test imported can hide an arrow."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("gateway", "engines", "loadtests", "tiergate")
# What each package may not import: everything above it, or beside it.
FORBIDDEN = {
    "gateway": ("engines", "loadtests", "tiergate"),
    "engines": ("gateway", "loadtests", "tiergate"),
}

# Imports the package and every module under it, then lists the forbidden modules loaded, with
# the module that first asked for each (a meta-path hook notes it; the import goes on as usual).
PROBE = r"""
import importlib, json, pkgutil, sys

package, forbidden = sys.argv[1], tuple(sys.argv[2:])
first = {}


class Watch:
    @staticmethod
    def find_spec(name, path=None, target=None):
        top = name.split(".")[0]
        if top in forbidden and top not in first:
            f = sys._getframe(1)
            while f is not None and f.f_globals.get("__name__", "").startswith(
                ("importlib", "_frozen_importlib", "pkgutil")
            ):
                f = f.f_back
            first[top] = [f.f_globals.get("__name__") if f else None, name]
        return None


sys.meta_path.insert(0, Watch)
errors = {}


def failed(name):
    errors[name] = repr(sys.exc_info()[1])


names = [package]
root = importlib.import_module(package)
for m in pkgutil.walk_packages(root.__path__, package + ".", onerror=failed):
    if not m.name.endswith(".__main__"):  # a script: importing it would run the command
        names.append(m.name)
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {e}"
loaded = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps({"modules": names, "loaded": loaded, "first": first, "errors": errors}))
"""


def probe(package: str, forbidden: tuple[str, ...]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, package, *forbidden],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_every_module_of_the_package_stays_in_its_layer(package: str) -> None:
    result = probe(package, FORBIDDEN[package])
    assert len(result["modules"]) > 1, result["modules"]
    assert not result["errors"], f"modules of {package} that do not import: {result['errors']}"
    arrows = [f"{by} imports {name}" for by, name in result["first"].values()]
    assert result["loaded"] == [], f"{package} loads {result['loaded']}: {arrows}"


def test_the_probe_sees_an_import_across_layers() -> None:
    # The command sits above the gateway, so probing it for the gateway must find it.
    result = probe("tiergate", ("gateway",))
    assert "gateway.serve.cli" in result["loaded"]
    assert result["first"]["gateway"][0] == "tiergate.cli"


def test_importing_the_gateway_package_loads_no_other_layer() -> None:
    others = [layer for layer in LAYERS if layer != "gateway"]
    code = (
        "import json, sys\nimport gateway\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {others!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def imports_of(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of `package` (read, not run) and the modules of `package` it imports:
    every import statement counts, at the top, inside a function, or for type checking only.
    Importing `a.b.c` counts as importing `a.b.c` (a package's `__init__` is a module too)."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package `level` - 1 steps up
                    up = here[: len(here) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]  # fmt: skip
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_no_import_circle_in_the_package(package: str) -> None:
    graph = imports_of(package)
    assert len(graph) > 1
    found = circles(graph)
    detail = [{m: sorted(graph[m] & set(c)) for m in c} for c in found]
    assert found == [], f"import circles in {package}: {detail}"


def test_the_circle_check_sees_a_circle_through_a_type_only_import(tmp_path: Path) -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    # A package read from files: an import under TYPE_CHECKING and one inside a function count.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("from typing import TYPE_CHECKING\n"
                                "if TYPE_CHECKING:\n    from pkg.two import X\n")  # fmt: skip
    (pkg / "two.py").write_text("def f():\n    from . import one\n")
    graph = imports_of("pkg", tmp_path)
    assert circles(graph) == [["pkg.one", "pkg.two"]]


# The floors inside the gateway, bottom up, each a package (or several) of gateway/: each imports
# only from its own floor or those below: the contracts (API models, errors, the exchange,
# transport and wire protocols with the engine kinds, routing), the configuration, observation
# (metrics, tracing's setup), the backends' state, the request pipeline, the host.
FLOORS: tuple[tuple[str, frozenset[str]], ...] = (
    ("contracts", frozenset({"core", "planner", "routing", "wire"})),
    ("config", frozenset({"config"})),
    ("observe", frozenset({"observe"})),
    ("backends", frozenset({"backends"})),
    ("pipeline", frozenset({"pipeline"})),
    ("host", frozenset({"serve"})),
)


def floor_of(module: str) -> int:
    """The floor of `gateway.<name>[...]` (the package itself: the top)."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(FLOORS)
    for i, (_, names) in enumerate(FLOORS):
        if parts[1] in names:
            return i
    raise AssertionError(f"{module} is on no floor: add it to FLOORS")


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a floor to one above it."""

    def name(m: str) -> str:
        f = floor_of(m)
        return f"{m} ({FLOORS[f][0] if f < len(FLOORS) else 'package'})"

    return [f"{name(m)} imports {name(d)}" for m, deps in sorted(graph.items())
            for d in sorted(deps) if "." in m and floor_of(d) > floor_of(m)]  # fmt: skip


def test_every_import_in_the_gateway_points_down_its_floors() -> None:
    graph = imports_of("gateway")
    assert {m.split(".")[1] for m in graph if "." in m} == set().union(*(n for _, n in FLOORS))
    # No module lies flat beside the floors: each is inside a floor's package.
    flat = [p.name for p in (ROOT / "gateway").glob("*.py") if p.name != "__init__.py"]
    assert flat == [], f"modules of no floor: {flat}"
    assert upward(graph) == []


@pytest.mark.parametrize(
    ("module", "floor"),
    [("gateway.core.exchange", "contracts"), ("gateway.routing.learned", "contracts"),
     ("gateway.config.settings", "config"), ("gateway.backends.monitor", "backends"),
     ("gateway.pipeline.upstream", "pipeline"), ("gateway.serve.app", "host")],
)  # fmt: skip
def test_the_floor_of_a_module(module: str, floor: str) -> None:
    assert FLOORS[floor_of(module)][0] == floor


def test_an_import_up_the_floors_is_found() -> None:
    graph = {"gateway.core.exchange": {"gateway.pipeline.tracing"},
             "gateway.pipeline.tracing": {"gateway.core.exchange"},
             "gateway.serve.app": {"gateway.pipeline.upstream"}}  # fmt: skip
    assert upward(graph) == [
        "gateway.core.exchange (contracts) imports gateway.pipeline.tracing (pipeline)"
    ]
    with pytest.raises(AssertionError, match="on no floor"):
        floor_of("gateway.newcomer")
