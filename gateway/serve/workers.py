"""`tiergate serve --workers N`: N gateway processes on one port, sharing their in-flight counts
so that routing sees every worker's requests.

The parent (`supervise`) serves nothing: it holds the port, starts the workers (spawned, so
none inherits a half-initialised event loop), restarts one that dies after it started (logged),
and on SIGTERM or SIGINT tells every worker, once per signal, so that each drains exactly as a
single gateway does (gateway.serve.server: the first signal drains, the second cuts, the third stops
waiting). It exits once all have, nonzero if a worker failed to start.

Each worker binds the port itself with SO_REUSEPORT, so the kernel spreads new connections
evenly over the workers' own accept queues. A socket bound by the parent and inherited was the
alternative: every worker would then wait on one queue, and the one whose loop wakes first
accepts everything pending (uvloop accepts until the queue is empty), so a burst of new
connections lands on one worker. Measured with two uvloop processes and 64 connections opened
at once (as wrk and most pools do), three times each: 64/0, 64/0 and 58/6 with an inherited
socket, 29/35, 30/34 and 31/33 with SO_REUSEPORT. The parent binds the port too, without
listening: the kernel gives it no connection, but the port stays taken while workers restart, a
port in use fails the start at once, and port 0 is resolved once for all.

Parent and worker talk over a socket pair: the worker says when it serves, the parent sends
each signal's name. SIGHUP goes to every worker too, each rereading the config file's releases
(gateway.serve.admin); a release table a worker publishes after an admin change is relayed to every
worker in the order it arrived (the sender included, so all end on the same one) and kept for
workers started later. The workers ignore SIGTERM and SIGINT themselves: a terminal's Ctrl-C, or
a service manager signalling the whole process group, reaches them too, and each signal must
count once. A worker that reads the end of the pair (its parent is gone, even killed) drains
as on SIGTERM, so none is left behind.

Metrics: the workers write theirs in prometheus_client's multiprocess mode, to files in a
folder the supervisor makes (`/dev/shm/tiergate-metrics-<pid>-<random>`, removed on exit), so
that /metrics on any worker reports the whole gateway (gateway.observe.telemetry); a dead worker's
gauges are dropped, its counters kept.

The in-flight counts: without Redis, a shared-memory table (gateway.backends.state.shared), exact,
and the latency tier's hard cap is checked again under a lock as a lease is taken
(gateway.backends.registry.Lease), since another worker may take the last slot between a decision
and its lease. With Redis, each worker is one more replica of the Redis store: eventually
consistent, within its sync interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client.multiprocess import mark_process_dead

from gateway.backends.state import SharedTable
from gateway.config.settings import LimitsConfig, Settings
from gateway.serve.admin import RELEASES_MESSAGE

__all__ = ["WorkerSpec", "supervise"]

log = logging.getLogger(__name__)

_STARTED = b"started"
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_HANGUP = b"SIGHUP"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker is told at its start: its row in the table (if any), and the port."""

    slot: int
    port: int
    table: SharedTable | None


def bind(host: str, port: int) -> list[socket.socket]:
    """TCP sockets bound (not listening) to `host`'s addresses on `port` with SO_REUSEPORT;
    port 0 picks one free port for all of them."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    out: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], port, *address[2:]))
            port = sock.getsockname()[1]
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


def metrics_dir(parent: int) -> str:
    """A new folder for the workers' metric files: in shared memory where there is one."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix=f"tiergate-metrics-{parent}-", dir=base)


# --- the parent ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    spec: WorkerSpec
    process: BaseProcess
    conn: Connection
    started: bool = False

    def tell(self, sig: int) -> None:
        self.send(signal.Signals(sig).name.encode())

    def send(self, message: bytes) -> None:
        with contextlib.suppress(OSError):  # gone already: its exit is on its way
            self.conn.send_bytes(message)


@dataclass(eq=False)
class _Supervisor:
    settings: Settings
    ready: Callable[[int], None] | None
    port: int = 0
    table: SharedTable | None = None
    workers: dict[int, _Worker] = field(default_factory=dict)
    signals: list[int] = field(default_factory=list)  # received, not yet passed on
    # The release table a worker last published (an admin change), for restarted workers;
    # None: the config file's, which every worker reads itself.
    releases: bytes | None = None
    stopping: bool = False
    failed: bool = False
    announced: bool = False

    def run(self) -> int:
        s = self.settings
        try:
            held = bind(s.host, s.port)
        except OSError as e:
            log.error("cannot bind the gateway's port", extra={"fields": {
                "host": s.host, "port": s.port, "error": str(e)}})  # fmt: skip
            return 1
        self.port = held[0].getsockname()[1]
        # Read by each worker's prometheus_client as it is imported: spawned workers inherit it.
        metrics = os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir(os.getpid())
        if not s.redis_url:
            urls = [b.url for t in s.tiers for b in t.backends]
            self.table = SharedTable.create(list(dict.fromkeys(urls)), s.workers)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (*_SIGNALS, signal.SIGHUP)}
        previous_wakeup = signal.set_wakeup_fd(wake_w)
        try:
            log.info("starting workers", extra={"fields": {
                "workers": s.workers, "port": self.port,
                "state": "redis" if s.redis_url else "shared"}})  # fmt: skip
            if not s.redis_url and any(t.limits != LimitsConfig() for t in s.tenants):
                # The per-minute limits are shared through Redis only (gateway.pipeline.limits).
                log.warning("tenants' limits are counted by each worker on its own without "
                            "redis_url: a key gets up to N times its limit", extra={"fields": {
                                "workers": s.workers}})  # fmt: skip
            for slot in range(s.workers):
                self._start(slot)
            while self.workers:
                self._step(wake_r)
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for worker in self.workers.values():  # only after an error of the parent's own
                worker.process.kill()
                worker.process.join()
            if self.table is not None:
                self.table.unlink()
            shutil.rmtree(metrics, ignore_errors=True)
            for fd in (wake_r, wake_w):
                os.close(fd)
            for sock in held:
                sock.close()
        return 1 if self.failed else 0

    def _on_signal(self, sig: int, frame: Any) -> None:
        # Only noted here: the loop passes it on (the wakeup fd makes its wait return).
        self.signals.append(sig)

    def _step(self, wake: int) -> None:
        conns = {w.conn: w for w in self.workers.values() if not w.conn.closed}
        exits = {w.process.sentinel: w for w in self.workers.values()}
        for ready in wait([wake, *conns, *exits]):
            if ready == wake:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 512)
            elif isinstance(ready, Connection):
                self._heard(conns[ready])
            elif isinstance(ready, int) and ready in exits:
                self._exited(exits[ready])
        while self.signals:
            sig = self.signals.pop(0)
            if sig == signal.SIGHUP:  # each worker rereads the config file
                log.info("SIGHUP: workers reload the config file")
                self.releases = None
                for worker in self.workers.values():
                    worker.send(_HANGUP)
                continue
            if not self.stopping:
                log.info("stopping workers", extra={"fields": {
                    "signal": signal.Signals(sig).name}})  # fmt: skip
            self.stopping = True
            for worker in self.workers.values():
                worker.tell(sig)

    def _start(self, slot: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        here, there = ctx.Pipe()
        spec = WorkerSpec(slot, self.port, self.table)
        process = ctx.Process(
            target=_work, args=(self.settings, spec, there), name=f"tiergate-worker-{slot}"
        )
        process.start()
        there.close()  # the worker holds the only other end: its end of file means it is gone
        worker = self.workers[slot] = _Worker(spec, process, here)
        if self.stopping:
            worker.tell(signal.SIGTERM)

    def _heard(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv_bytes()
        except (EOFError, OSError):
            worker.conn.close()  # it is exiting: its sentinel will say so
            return
        if message.startswith(RELEASES_MESSAGE):
            # In one order to all, the sender too, so that all end on the same table.
            self.releases = message
            for each in self.workers.values():
                each.send(message)
            return
        if message == _STARTED and not worker.started:
            worker.started = True
            if self.releases is not None:  # restarted after an admin change
                worker.send(self.releases)
            if self.stopping or self.announced:
                return
            if all(w.started for w in self.workers.values()):
                self.announced = True
                log.info("workers serving", extra={"fields": {
                    "workers": len(self.workers), "port": self.port}})  # fmt: skip
                if self.ready is not None:
                    threading.Thread(target=self.ready, args=(self.port,), daemon=True).start()

    def _exited(self, worker: _Worker) -> None:
        slot, process = worker.spec.slot, worker.process
        process.join()
        worker.conn.close()
        del self.workers[slot]
        if self.table is not None:
            self.table.clear(slot)  # its requests ended with it
        if process.pid is not None:  # its gauges say nothing any more; its counters stay
            mark_process_dead(process.pid)  # type: ignore[no-untyped-call]
        fields = {"worker": slot, "pid": process.pid, "exit": process.exitcode}
        if self.stopping:
            if process.exitcode:
                log.warning("worker exited with an error", extra={"fields": fields})
        elif not worker.started:
            log.error("worker failed to start: stopping", extra={"fields": fields})
            self.failed = True
            self.signals.append(signal.SIGTERM)
        else:
            log.warning("worker exited unexpectedly: restarting", extra={"fields": fields})
            self._start(slot)


def supervise(settings: Settings, ready: Callable[[int], None] | None = None) -> int:
    """Run `settings.workers` gateway workers on the settings' port until a signal and their
    drain; `ready(port)` is called in a thread once they all serve. The exit status: 1 if a
    worker failed to start (or the port could not be bound), else 0."""
    return _Supervisor(settings, ready).run()


# --- a worker --------------------------------------------------------------------------------


def _work(settings: Settings, spec: WorkerSpec, conn: Connection) -> None:
    """A worker process: one gateway, on its own socket of the shared port."""
    import uvloop

    from gateway.backends.state import make_store
    from gateway.observe.telemetry import setup_logging
    from gateway.serve.app import create_app
    from gateway.serve.assembly import Hosting
    from gateway.serve.server import build_server, run_server

    for sig in (*_SIGNALS, signal.SIGHUP):  # its parent passes them on (module docstring)
        signal.signal(sig, signal.SIG_IGN)
    setup_logging(settings.log_level, settings.log_json)
    shared = None if spec.table is None else (spec.table, spec.slot)
    # Its admin changes go to the other workers too.
    hosting = Hosting(store=make_store(settings.redis_url, shared), publish=conn.send_bytes)
    app = create_app(settings, hosting)
    server = build_server(settings, app)
    sockets = bind(settings.host, spec.port)

    def heard() -> None:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(conn.fileno())
            log.warning("the workers' parent is gone: draining")
            if spec.table is not None:
                spec.table.unlink()  # nobody else will
            shutil.rmtree(os.environ.get("PROMETHEUS_MULTIPROC_DIR", ""), ignore_errors=True)
            message = b"SIGTERM"
        if message.startswith(RELEASES_MESSAGE):
            if app.gateway is not None:
                app.gateway.control.received(message)
        elif message == _HANGUP:
            app.hangup()
        else:
            server.on_signal(signal.Signals[message.decode()])

    async def started() -> None:
        conn.send_bytes(_STARTED)

    async def main() -> None:
        asyncio.get_running_loop().add_reader(conn.fileno(), heard)
        await run_server(server, sockets, started)

    uvloop.run(main())
    if not server.started:
        raise SystemExit(1)
