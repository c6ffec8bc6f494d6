"""The peer routers the benchmarks put beside tiergate: vLLM's router (`vllm-router`), SGLang's
model gateway (`smg`, package `sglang-router`) and LiteLLM's proxy (`litellm[proxy]`).

They live in a virtual environment of their own, created on first use (`python -m venv`, then one
`pip install` per peer, so that one failing install does not block the others): each pins its own
dependencies, which the project's must not inherit. The default folder is
`$XDG_CACHE_HOME/tiergate/peers-venv` (`~/.cache/...`), or `$TIERGATE_PEERS_VENV`.

`PeerProcess` starts one of them on a free loopback port in front of given worker URLs (vLLM-API
simulators), with its own log, and stops it and anything it started, whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import yaml
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loadtests.harness.procs import free_port, terminate

ENV_VAR = "TIERGATE_PEERS_VENV"


@dataclass(frozen=True)
class Peer:
    name: str  # the target's name in the reports
    requirement: str  # what pip installs
    distribution: str  # the installed distribution's name, for its version
    command: str  # the console script in the venv's bin
    policies: tuple[str, ...] = ()  # what its --policy accepts (LiteLLM: none)


ROUTER_POLICIES = ("round_robin", "random", "power_of_two", "cache_aware")
PEERS = {
    "vllm-router": Peer("vllm-router", "vllm-router", "vllm-router", "vllm-router",
                        ROUTER_POLICIES),
    "smg": Peer("smg", "sglang-router", "sglang-router", "smg", ROUTER_POLICIES),
    "litellm": Peer("litellm", "litellm[proxy]", "litellm", "litellm"),
}  # fmt: skip


def default_venv() -> Path:
    if path := os.environ.get(ENV_VAR):
        return Path(path).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tiergate" / "peers-venv"


def scrub(text: str, venv: Path) -> str:
    """`text` without this machine's paths (the venv's, the home folder): reports are shared."""
    for path, name in ((str(venv), "<peers-venv>"), (str(Path.home()), "~")):
        text = text.replace(path, name)
    return text


@dataclass(frozen=True)
class Installed:
    peer: Peer
    binary: Path | None  # None: not usable, `note` says why
    version: str | None
    note: str | None = None


def _versions(python: Path, dists: Sequence[str]) -> dict[str, str | None]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(d):\n"
        "    try: return m.version(d)\n"
        "    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({d: v(d) for d in sys.argv[1:]}))"
    )
    proc = subprocess.run([str(python), "-c", code, *dists], capture_output=True, text=True,
                          check=False, timeout=120)  # fmt: skip
    if proc.returncode != 0:
        return dict.fromkeys(dists)
    found: dict[str, str | None] = json.loads(proc.stdout)
    return found


def _pip_install(python: Path, peer: Peer, log: Path, progress: Progress) -> str | None:
    """pip install one peer, its last output line shown as it goes; None, or why it failed."""
    task = progress.add_task(f"pip install {peer.requirement}", total=None)
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", peer.requirement]
    last = ""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                if line.strip():
                    last = line.strip()
                    progress.update(task, description=f"{peer.requirement}: {last[:70]}")
            proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: no pip left behind
                proc.kill()
                proc.wait()
    progress.remove_task(task)
    return None if proc.returncode == 0 else f"pip exited with {proc.returncode}: {last[:300]}"


def ensure(
    names: Sequence[str], venv: Path, install: bool, console: Console | None = None
) -> dict[str, Installed]:
    """The peers `names` ready to run from `venv`: created and installed when missing (unless
    `install` is false); a peer that is not there afterwards carries a note saying why."""
    console = console or Console()
    peers = [PEERS[n] for n in names]
    python = venv / "bin" / "python"
    if not python.exists():
        if not install:
            why = "not installed (no peers' virtual environment; --no-install)"
            return {p.name: Installed(p, None, None, why) for p in peers}
        with console.status("creating the peers' virtual environment (python -m venv)..."):
            proc = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                                  text=True, check=False)  # fmt: skip
        if proc.returncode != 0:
            why = f"python -m venv failed: {scrub(proc.stderr.strip()[-300:], venv)}"
            return {p.name: Installed(p, None, None, f"not installed ({why})") for p in peers}
    found = _versions(python, [p.distribution for p in peers])
    failures: dict[str, str] = {}
    missing = [p for p in peers if not _usable(venv, p, found)]
    if missing and install:
        listed = ", ".join(p.requirement for p in missing)
        console.print(
            f"installing {listed} into the peers' virtual environment (once; they stay out of "
            "the project's dependencies)"
        )
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            for p in missing:
                failed = _pip_install(python, p, venv / f"install-{p.name}.log", progress)
                if failed is not None:
                    failures[p.name] = scrub(failed, venv)
        found = _versions(python, [p.distribution for p in peers])
    out = {}
    for p in peers:
        if _usable(venv, p, found):
            out[p.name] = Installed(p, venv / "bin" / p.command, found[p.distribution])
        elif p.name in failures:
            out[p.name] = Installed(p, None, None, f"could not be installed ({failures[p.name]})")
        else:
            why = "--no-install" if not install else f"no {p.command} command after installing"
            out[p.name] = Installed(p, None, None, f"not installed ({why})")
    return out


def _usable(venv: Path, peer: Peer, found: dict[str, str | None]) -> bool:
    return found.get(peer.distribution) is not None and (venv / "bin" / peer.command).exists()


# --- processes ------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc): where a multi-process server works."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return out


def litellm_config(worker_urls: Sequence[str], model: str) -> dict[str, object]:
    """One deployment per worker under the same model name: LiteLLM's router spreads over them
    (its default, simple-shuffle)."""
    return {
        "model_list": [
            {"model_name": model,
             "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"{url}/v1"}}
            for url in worker_urls
        ],
    }  # fmt: skip


# LiteLLM as a benchmark runs it: no remote price list to fetch at start (no network needed), no
# log line per request (the gateway and nginx log none), and no master key: none of the others
# authenticates either, and LiteLLM refuses to start keyless unless told so.
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "WARNING",
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
}


@dataclass
class PeerProcess:
    """One peer router on a free loopback port in front of `worker_urls`; ready once a small
    completion through it answers 200."""

    peer: Peer
    binary: Path
    worker_urls: Sequence[str]
    model: str
    workdir: Path
    policy: str | None = None  # vllm-router and smg only
    label: str = ""  # names the log file; default the peer's name
    port: int = 0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        name = (self.label or self.peer.name).replace(":", "-")
        return self.workdir / f"{name}.log"

    def argv(self) -> list[str]:
        binary, port = str(self.binary), str(self.port)
        if self.peer.name == "litellm":
            config = self.log.with_suffix(".yaml")
            config.write_text(yaml.safe_dump(litellm_config(self.worker_urls, self.model)))
            return [binary, "--host", "127.0.0.1", "--port", port, "--config", str(config)]
        # Their metrics listen on a port of their own (29000 by default): one free port each, so
        # that several can run side by side. Logs at warning level, as every other target's.
        common = ["--host", "127.0.0.1", "--port", port, "--worker-urls", *self.worker_urls,
                  "--policy", self.policy or "round_robin",
                  "--prometheus-port", str(free_port()),
                  "--worker-startup-check-interval", "1"]  # fmt: skip
        if self.peer.name == "smg":
            return [binary, "launch", *common, "--log-level", "warn"]
        return [binary, *common, "--log-level", "warning"]

    def spawn(self) -> Self:
        """Start the process without waiting for it (several peers start side by side)."""
        if not self.port:
            self.port = free_port()
        env = {**os.environ, **(LITELLM_ENV if self.peer.name == "litellm" else {})}
        # Its own cwd: LiteLLM reads a .env file from there, and writes nothing elsewhere.
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, cwd=self.workdir,
            )  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until a one-token completion through it answers 200; RuntimeError (with its log's
        last lines) when it exits or does not answer in time."""
        assert self.proc is not None
        body = json.dumps({"model": self.model, "prompt": "hello", "max_tokens": 1}).encode()
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}: {self.log_tail()}")
            req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except OSError as e:
                last = str(e)
            time.sleep(0.1)
        raise RuntimeError(f"no 200 within {timeout:g} s ({last}): {self.log_tail()}")

    def log_tail(self, lines: int = 2) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        kept = [line.strip()[:300] for line in text.splitlines() if line.strip()]
        return " | ".join(kept[-lines:])

    def pids(self) -> list[int]:
        assert self.proc is not None
        return process_tree(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None:
            return
        below = self.pids()[1:] if self.proc.poll() is None else []
        terminate(self.proc)
        for pid in below:  # a worker its parent did not take down
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        self.proc = None

    def __enter__(self) -> Self:
        self.spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
