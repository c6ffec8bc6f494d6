"""Which build of the routing modules to import: the compiled one, or these sources.

The routing modules on a decision's path (`COMPILED`) can be compiled to C extensions with
mypyc (`tiergate.native`, run by `scripts/_venv.sh` where a C compiler is found): the same
sources, type-checked with `mypy --strict`, about half the time per decision
(docs/results/decision-cost-compiled). The build lives in `_compiled/` beside this file,
with a manifest of the sources it was built from. The package imports it only while every
source of `gateway/routing/` is the one it was built from and the interpreter is the one it was
built for; otherwise, or with `TIERGATE_COMPILED=0`, it imports the sources. So an edited
source is never shadowed by an older build, and nothing fails where no compiler was found.

This module is never compiled itself: it decides which build the others come from.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["COMPILED", "FOLDER", "MANIFEST", "build_path", "fingerprint", "manifest"]

# The modules a routing decision runs through, compiled together. (Not `params`: its pydantic
# model is built and validated by pydantic at run time; nor this module.)
COMPILED = (
    "types", "curves", "filters", "saturation", "order", "learned", "affinity", "golden",
    "baselines",
)  # fmt: skip
FOLDER = "_compiled"
MANIFEST = "manifest.json"


def fingerprint(package: Path) -> dict[str, str]:
    """Each source of the package (every `.py` in it: the compiled modules and all they
    import, since routing imports nothing from outside its package) by its SHA-256."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(package.glob("*.py"))
    }


def manifest(sources: Mapping[str, str]) -> dict[str, Any]:
    """What a build of `sources` (their `fingerprint`) for this interpreter records beside it,
    and what the package finds there when the build is current."""
    return {"ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"), "sources": dict(sources),
            "modules": list(COMPILED)}  # fmt: skip


def build_path(package: Path, env: Mapping[str, str]) -> list[str]:
    """The folder to search for the package's modules before its own (as a one-item list to
    put at the front of the package's `__path__`), or no folder: when `TIERGATE_COMPILED` is
    `0`, when nothing was built, or when the build is not of these sources or not for this
    interpreter."""
    if env.get("TIERGATE_COMPILED", "1") == "0":
        return []
    folder = package / FOLDER
    try:
        built = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return []
    return [str(folder)] if built == manifest(fingerprint(package)) else []
