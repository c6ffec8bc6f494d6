"""`python -m tiergate.native`: compile the routing modules on a decision's path with mypyc
(gateway.routing.native says which, and how the package picks the build up).

mypyc (the mypy project's compiler) turns the same type-checked sources into C extensions; a
routing decision then takes about half the time (docs/results/decision-cost-compiled). It needs
a C compiler and Python's headers: where either is missing, or the build fails, this says so
and the gateway runs the sources, as it does everywhere the build is absent or out of date.
Nothing is rebuilt while the build matches the sources (`--force` rebuilds).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from gateway.routing import native

# Run in a scratch copy of the package, so that setuptools sees no project of its own and the
# sources are not touched. `separate`: one extension per module, each inside the package (a
# group's shared part would otherwise be a top-level module that `sys.path` must hold).
_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(name="tiergate-routing", packages=[], script_args=["build_ext", "--inplace"],
      ext_modules=mypycify(sys.argv[1:], separate=True, opt_level="3"))
"""


def package() -> Path:
    return Path(native.__file__).parent


def missing() -> str | None:
    """Why this machine cannot compile (None: it can)."""
    for name in ("mypyc", "setuptools"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        return f"no C compiler ({' '.join(cc) or 'cc'} not found)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        return f"no Python headers ({headers} not found: the python3-dev package has them)"
    return None


def current(pkg: Path) -> bool:
    """Whether the build in `pkg` is of its sources and for this interpreter."""
    return bool(native.build_path(pkg, {}))


def build(pkg: Path, log: Path) -> Path:
    """Compile `native.COMPILED` of `pkg` into its build folder, with the manifest that lets the
    package import them. Raises CalledProcessError (the compiler's output in `log`)."""
    with tempfile.TemporaryDirectory(prefix="tiergate-native-") as tmp:
        work = Path(tmp)
        copy = work / "gateway" / "routing"
        copy.mkdir(parents=True)
        (work / "gateway" / "__init__.py").write_text("")
        for source in pkg.glob("*.py"):
            shutil.copy2(source, copy / source.name)
        # What was compiled: a source edited meanwhile no longer matches, and is imported.
        sources = native.fingerprint(copy)
        paths = [f"gateway/routing/{m}.py" for m in native.COMPILED]
        with log.open("w") as out:
            subprocess.run([sys.executable, "-c", _SETUP, *paths], cwd=work, stdout=out,
                           stderr=subprocess.STDOUT, check=True)  # fmt: skip
        built = sorted(copy.glob(f"*{sysconfig.get_config_var('EXT_SUFFIX')}"))
        folder = pkg / native.FOLDER
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        for so in built:
            shutil.copy2(so, folder / so.name)
    (folder / native.MANIFEST).write_text(json.dumps(native.manifest(sources), indent=2) + "\n")
    return folder


def command(
    force: Annotated[bool, typer.Option(help="Rebuild even if the build is current.")] = False,
) -> None:
    """Compile the routing modules on a decision's path with mypyc, where a C compiler and
    Python's headers are found; otherwise say why and leave the gateway on its sources."""
    pkg = package()
    if not force and current(pkg):
        print(f"tiergate: the compiled routing modules are current ({pkg / native.FOLDER})")
        return
    why = missing()
    if why is not None:
        print(f"tiergate: routing runs from its sources, not compiled: {why}")
        return
    log = Path(tempfile.gettempdir()) / "tiergate-native.log"
    started = time.monotonic()
    print(f"tiergate: compiling {len(native.COMPILED)} routing modules with mypyc "
          f"(about a minute; log: {log})...", flush=True)  # fmt: skip
    try:
        folder = build(pkg, log)
    except subprocess.CalledProcessError:
        print(f"tiergate: the mypyc build failed, routing runs from its sources; see {log}")
        raise typer.Exit(1) from None
    print(f"tiergate: compiled in {time.monotonic() - started:.0f} s into {folder}")


def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    main()
