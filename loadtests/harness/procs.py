"""Start and stop `tiergate` processes (simulators, gateways) on loopback ports, for
`tiergate up`, the benchmarks and the tests."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

# The folder this harness was imported from (a checkout, or an installed tree): the processes
# it starts import their code from there too (`ManagedProcess.command`).
_ROOT = str(Path(__file__).resolve().parents[2])


def _ephemeral() -> tuple[int, int]:
    """The kernel's range of ports for the local end of outgoing connections."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


# Below the ephemeral range: ports here are never a connection's local end.
_LOWEST = 10_000


# Ports drawn here, claimed against every other process that draws here (tests in parallel,
# each holding ports it drew for servers it may start only later): a file per port.
_CLAIMS = Path(tempfile.gettempdir()) / "tiergate-ports"
# A claim older than this is stale (its process is gone or long done): nothing here keeps a
# port unbound this long, and a port bound by then fails `bindable` anyway.
_CLAIM_S = 900.0


def _claim(port: int) -> bool:
    """Whether this process may have `port`: its claim created now, or the claim found stale
    and replaced. Another process's live claim: no."""
    path = _CLAIMS / str(port)
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return True
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime < _CLAIM_S:
                    return False
                path.unlink()
            except OSError:  # gone meanwhile (try again), or another user's
                continue
        except OSError:
            return True  # no claims here (a read-only temporary folder): `bindable` decides
    return False


def free_ports(n: int = 1, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """The first of `n` consecutive ports that nothing holds now (none in `avoid`, none drawn
    by another process in the last `_CLAIM_S` seconds), drawn at random below the kernel's
    ephemeral range.

    Not from that range (a bind to port 0): there a client that polls a server not yet
    listening may be given the server's port as its own end and connect to itself (reading back
    its own request), holding the port the server then cannot bind, and any outgoing
    connection of the machine may take a port meant for a server between its choice and its
    bind. Claimed, because a port drawn for a server that starts later (`tiergate up`'s
    simulators added by the planner) is bindable until then, and a test beside it would
    otherwise draw it too."""
    low, high = _ephemeral()
    if low - n > _LOWEST + 1000:
        span = (_LOWEST, low - n)  # below the range
    elif high + 1000 < 65535 - n:
        span = (high + 1, 65535 - n)  # above it
    else:
        span = (1024, 65535 - n)  # it covers nearly every port: anywhere
    with contextlib.suppress(OSError):
        _CLAIMS.mkdir(mode=0o777, exist_ok=True)
    for _ in range(1000):
        first = random.randrange(*span)
        run = range(first, first + n)
        if (not any(p in run for p in avoid) and all(bindable(p, host) for p in run)
                and all(_claim(p) for p in run)):  # fmt: skip
            return first
    raise RuntimeError(f"no {n} consecutive free ports in {span[0]}-{span[1] + n}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing holds now (`free_ports`)."""
    return free_ports(1, host)


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing holds `port`: no listener, and no connection's end either (which a connect would
    not see)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wait_http(url: str, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers 200; fail early if `proc` died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout}s ({last})")


def terminate(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within the grace period."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace_s)


@dataclass
class ManagedProcess:
    """A `tiergate ...` subprocess on a loopback port, ready once `ready_path` answers 200."""

    port: int = 0
    host: str = "127.0.0.1"
    log: Path | None = None
    env: dict[str, str] | None = None
    ready_path: str = "/health"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def command(self) -> list[str]:
        # -P: the working directory is not put first on sys.path (as `-m` would), so the process
        # runs the code this harness was imported from (`environment`) wherever it is started:
        # a bench run from one checkout with another on PYTHONPATH ran the first one's gateway.
        return [sys.executable, "-P", "-m", "tiergate", *self.argv()]

    def environment(self) -> dict[str, str]:
        """The process's environment: this one's, the process's own variables, and this
        harness's folder first on PYTHONPATH (unless the process names its own)."""
        own = self.env or {}
        env = {**os.environ, **own}
        if "PYTHONPATH" not in own:
            path = env.get("PYTHONPATH")
            env["PYTHONPATH"] = _ROOT if not path else f"{_ROOT}{os.pathsep}{path}"
        return env

    def start(self, timeout: float = 20.0) -> Self:
        """Start and wait until ready. A port drawn here that another process (a parallel test,
        a server that chose it too) binds between the draw and the bind is drawn again: the
        process then exits early while someone else holds its port."""
        if self.port:  # the caller's: never changed
            return self._launch(timeout)
        for _ in range(2):
            self.port = free_port(self.host)
            try:
                return self._launch(timeout)
            except RuntimeError:
                if bindable(self.port, self.host):
                    raise  # not taken by another process: a failure of its own
        self.port = free_port(self.host)
        return self._launch(timeout)

    def _launch(self, timeout: float) -> Self:
        cmd = self.command()
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        env = self.environment()
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        try:
            wait_http(self.url + self.ready_path, timeout, self.proc)
        except Exception as e:
            self.stop()
            tail = ""
            if self.log is not None and self.log.exists():
                # The process's own last words say why far better than the timeout does.
                tail = "\n" + self.log.read_text(errors="replace")[-2000:]
            name = type(self).__name__
            raise RuntimeError(f"{name} at {self.url} did not start: {e}{tail}") from e
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill without warning (the chaos tests' instance failure)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class SimProcess(ManagedProcess):
    """One `tiergate sim` process; `api="triton"` serves Triton's API instead of vLLM's, with
    its metrics on `metrics_port` when given (0 = a free port), as Triton does on 8002."""

    profile: str = "v3"
    args: Sequence[str] = ()
    api: str = "vllm"
    metrics_port: int | None = None
    grpc_port: int | None = None  # Triton's gRPC face (0 = a free port)

    def __post_init__(self) -> None:
        if self.api == "triton" and self.ready_path == "/health":
            self.ready_path = "/v2/health/ready"

    @property
    def metrics_url(self) -> str:
        if self.metrics_port:
            return f"http://{self.host}:{self.metrics_port}/metrics"
        return self.url + "/metrics"

    @property
    def grpc_target(self) -> str:
        """host:port of the gRPC face."""
        assert self.grpc_port, "started without a gRPC port"
        return f"{self.host}:{self.grpc_port}"

    def argv(self) -> list[str]:
        extra: list[str] = []
        if "--prefix-caching" not in self.args:
            # The benchmarks send one prompt again and again where the tutorial's sent random
            # ones, which no prefix cache serves: caching stays off unless asked for.
            extra.append("--no-prefix-caching")
        if self.api != "vllm":
            extra += ["--api", self.api]
            if self.metrics_port is not None:
                extra += ["--metrics-port", str(self.metrics_port)]
            if self.grpc_port is not None:
                extra += ["--grpc-port", str(self.grpc_port)]
        return ["sim", "--profile", self.profile, "--port", str(self.port), "--host", self.host,
                *extra, *self.args]  # fmt: skip

    def start(self, timeout: float = 20.0) -> Self:
        if self.api == "triton" and self.metrics_port == 0:
            self.metrics_port = free_port(self.host)
        if self.api == "triton" and self.grpc_port == 0:
            self.grpc_port = free_port(self.host)
        super().start(timeout)
        if self.metrics_port:
            try:
                wait_http(self.metrics_url, timeout, self.proc)
            except BaseException:
                self.stop()
                raise
        return self


@dataclass
class GatewayProcess(ManagedProcess):
    """One `tiergate serve --config FILE` process."""

    config: Path | None = None
    ready_path: str = "/ready"

    def argv(self) -> list[str]:
        assert self.config is not None
        return ["serve", "--config", str(self.config), "--port", str(self.port),
                "--host", self.host]  # fmt: skip


@dataclass
class GranianGatewayProcess(GatewayProcess):
    """The gateway app (gateway.serve.asgi) served by granian instead of `tiergate serve`: one
    worker, uvloop, HTTP/1 only, as `tiergate serve` runs."""

    FACTORY = "gateway.serve.asgi:app"

    @classmethod
    def available(cls) -> bool:
        """Whether granian and the factory can be found by the interpreter that would run them."""
        probe = (
            "import importlib.util as u, sys; "
            "sys.exit(not (u.find_spec('granian') and u.find_spec('gateway.serve.asgi')))"
        )
        return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0

    def version(self) -> str:
        out = subprocess.run([sys.executable, "-m", "granian", "--version"],
                             capture_output=True, text=True, check=False)  # fmt: skip
        return out.stdout.strip().rsplit(" ", 1)[-1] or "unknown"

    def __post_init__(self) -> None:
        assert self.config is not None
        self.env = {**(self.env or {}), "TIERGATE_CONFIG": str(self.config)}

    def command(self) -> list[str]:
        return [sys.executable, "-P", "-m", "granian", "--interface", "asgi", "--factory",
                "--loop", "uvloop", "--http", "1", "--workers", "1", "--log-level", "warning",
                "--host", self.host, "--port", str(self.port), self.FACTORY]  # fmt: skip


def cpu_times(pid: int) -> tuple[float, float]:
    """The user and the system CPU time (s) a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    return sum(cpu_times(pid))


@contextlib.contextmanager
def cpu_meter(pid: int) -> Iterator[list[float]]:
    """Yields a list that holds, after the block, the cores the process used on average."""
    box: list[float] = []
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    yield box
    box.append((cpu_seconds(pid) - c0) / (time.perf_counter() - t0))


def start_all(stack: contextlib.ExitStack, *procs: ManagedProcess) -> None:
    """Start `procs` at once, each waiting for its own readiness (and saying why it did not
    start); `stack` stops them all, whatever happens."""
    for p in procs:
        stack.callback(p.stop)
    if not procs:
        return
    with ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(lambda p: p.start(), procs))
