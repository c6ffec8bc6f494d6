"""A gateway from another commit, run beside this one: its checkout in a temporary worktree,
its own import origins, and its process."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.harness.procs import GatewayProcess
from loadtests.harness.proxied import Target

# The repository whose commits a baseline ref names.
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Baseline:
    """A commit's code extracted into a folder, and how its gateway is started from there."""

    ref: str
    sha: str
    short: str
    folder: str
    module: str  # `python -m MODULE serve ...`: `tiergate`, or `gateway.cli` before it existed

    @property
    def name(self) -> str:
        return f"gateway@{self.short}"


def git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {shlex.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


@contextlib.contextmanager
def checkout(ref: str, into: Path) -> Iterator[Baseline]:
    """`ref`'s files (git archive: the repository and its worktrees are left untouched) in a
    folder under `into`, removed on the way out whatever happens."""
    sha = git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}")
    short = git("rev-parse", "--short", sha)
    root = (into / f"baseline-{short}").resolve()
    root.mkdir()
    try:
        tar = into / f"baseline-{short}.tar"
        git("archive", "--format=tar", f"--output={tar}", sha)
        untar = subprocess.run(
            ["tar", "-x", "-f", str(tar), "-C", str(root)], capture_output=True, text=True
        )
        tar.unlink()
        if untar.returncode != 0:
            raise RuntimeError(f"extracting {ref} ({short}) failed: {untar.stderr.strip()}")
        # The entry point of the day: the composed `tiergate` package, else the gateway's own CLI
        # (the layout before the package existed).
        module = "tiergate" if (root / "tiergate" / "__main__.py").exists() else "gateway.cli"
        yield Baseline(ref=ref, sha=sha, short=short, folder=str(root), module=module)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def import_origins(
    modules: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> dict[str, Path]:
    """Where this interpreter imports `modules` from, run with the given cwd and environment
    (which is how a launcher will run it): the proof of which code a gateway target runs."""
    code = "import importlib as i, sys\nfor m in sys.argv[1:]: print(i.import_module(m).__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"importing {', '.join(modules)} failed:\n{proc.stderr[-2000:]}")
    return {m: Path(line) for m, line in zip(modules, proc.stdout.splitlines(), strict=True)}


def code_folder(origins: dict[str, Path]) -> Path:
    """The folder the packages were imported from (`<folder>/gateway/__init__.py`)."""
    folders = {o.resolve().parents[1] for o in origins.values()}
    if len(folders) != 1:
        raise RuntimeError(f"packages imported from several folders: {origins}")
    return folders.pop()


@dataclass
class BaselineGatewayProcess(GatewayProcess):
    """`serve` of the baseline's code: cwd and PYTHONPATH are its folder, so that every import
    (gateway, engines, ...) resolves there before the working tree's editable install."""

    root: Path | None = None
    module: str = "gateway.cli"

    def command(self) -> list[str]:
        assert self.root is not None
        # `env -C` sets the cwd (which `python -m` puts first on sys.path): the launcher itself
        # starts every process in this one's cwd. exec keeps the pid, which the CPU is read from.
        return ["env", "-C", str(self.root), sys.executable, "-m", self.module, *self.argv()]


@contextlib.contextmanager
def baseline_gateway(baseline: Baseline, config: Path, log: Path) -> Iterator[Target]:
    root = Path(baseline.folder)
    env = {"PYTHONPATH": str(root)}
    entry = baseline.module.split(".")[0]
    origins = import_origins(sorted({"gateway", entry}), cwd=root, env=env)
    if (folder := code_folder(origins)) != root:
        raise RuntimeError(f"{baseline.name} would import its code from {folder}, not {root}")
    with BaselineGatewayProcess(
        config=config, log=log, env=env, root=root, module=baseline.module
    ) as gw:
        # The process that serves, not only the probe, runs from the extracted folder.
        cwd = Path(os.readlink(f"/proc/{gw.pid}/cwd"))
        if cwd != root:
            raise RuntimeError(f"{baseline.name} runs in {cwd}, not in {root}")
        yield Target(baseline.name, gw.url, lambda: [gw.pid], str(folder), log)
