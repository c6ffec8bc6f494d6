"""A real DNS server for tests and benches: Debian's dnsmasq on a loopback port, answering
for names whose addresses change on demand (a hosts file, re-read on SIGHUP), with a TTL of
0 so that every question sees the current set. Stopped and resumed (SIGSTOP / SIGCONT) to
play an outage."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import dns.nameserver
import dns.resolver

__all__ = ["DnsServer", "dnsmasq_binary"]


def dnsmasq_binary() -> str | None:
    return shutil.which("dnsmasq") or shutil.which("/usr/sbin/dnsmasq")


def _free_udp_and_tcp_port() -> int:
    """A loopback port free for both UDP and TCP a moment ago (dnsmasq listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port: int = udp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no loopback port free for UDP and TCP")


class DnsServer:
    """dnsmasq on 127.0.0.1:`port`, authoritative for the names `set` gives it, nothing else."""

    def __init__(self) -> None:
        binary = dnsmasq_binary()
        if binary is None:
            raise RuntimeError("dnsmasq is not installed (Debian: apt-get install dnsmasq-base)")
        self.dir = Path(tempfile.mkdtemp(prefix="tiergate-dns-"))
        # Readable by all: dnsmasq started as root reads it as the user it drops to.
        self.dir.chmod(0o755)
        self.hosts = self.dir / "hosts"
        self.hosts.write_text("")
        self.names: dict[str, list[str]] = {}
        self.port = _free_udp_and_tcp_port()
        self.proc = subprocess.Popen(
            [binary, "--keep-in-foreground", "--no-resolv", "--no-hosts", "--no-poll",
             f"--addn-hosts={self.hosts}", f"--port={self.port}", "--listen-address=127.0.0.1",
             "--bind-interfaces", "--local-ttl=0", "--log-facility=-", "--pid-file="],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.paused = False
        self._wait_listening()

    @property
    def address(self) -> str:
        """host:port, as the gateway's `nameservers` take it."""
        return f"127.0.0.1:{self.port}"

    def _wait_listening(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                raise RuntimeError(f"dnsmasq exited: {out}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError("dnsmasq did not listen")

    def set(self, name: str, addresses: list[str]) -> None:
        """`name` answers with `addresses` from now on (an empty list: no record)."""
        self.names[name] = list(addresses)
        lines = [f"{a} {n}" for n, addrs in self.names.items() for a in addrs]
        tmp = self.hosts.with_suffix(".new")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.chmod(0o644)
        tmp.replace(self.hosts)
        self.proc.send_signal(signal.SIGHUP)  # re-reads the hosts file
        self._wait_answering(name, frozenset(addresses))

    def answers(self, name: str) -> frozenset[str]:
        """What the server answers for `name` now (A records)."""
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver("127.0.0.1", self.port)]
        resolver.lifetime = 1.0
        try:
            return frozenset(r.address for r in resolver.resolve(name, "A", search=False))
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer, dns.resolver.NoNameservers):
            return frozenset()

    def _wait_answering(
        self, name: str, addresses: frozenset[str], timeout_s: float = 10.0
    ) -> None:
        """Until the server answers the new set (the signal is handled a moment later)."""
        deadline = time.monotonic() + timeout_s
        while self.answers(name) != addresses:
            if time.monotonic() > deadline:
                raise RuntimeError(f"dnsmasq does not answer {sorted(addresses)} for {name}")
            time.sleep(0.005)

    def pause(self) -> None:
        """No answer to anyone until `resume` (a server that is down)."""
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.paused:
            self.resume()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
