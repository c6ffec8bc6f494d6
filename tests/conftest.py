"""Shared test helpers: free loopback ports and throwaway redis-server processes."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from loadtests.harness.procs import free_ports

NO_REDIS = "redis-server is not installed (e.g. apt-get install redis-server)"


def free_port() -> int:
    """A loopback TCP port that nothing holds now (loadtests.harness.procs.free_ports)."""
    return free_ports(1)


class RedisProcess:
    """A redis-server on loopback with persistence off; can be stopped and restarted on its port."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip(NO_REDIS)
        log = self._workdir / f"redis-{self.port}.log"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self._workdir), "--logfile", str(log)]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self._proc.poll() is not None:
                    text = log.read_text() if log.exists() else ""
                    raise RuntimeError(f"redis-server exited early:\n{text[-2000:]}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer PING on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """SIGKILL: the point is to look like a crash, and persistence is off anyway."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a redis-server shared by the whole session: isolate tests by key prefix."""
    server = RedisProcess(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own, for tests that stop or restart it."""
    server = RedisProcess(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
