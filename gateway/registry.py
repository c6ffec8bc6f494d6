"""The backend registry: each backend's configuration, wire adapter and live status (scraped
load, health, ejection, in-flight leases), in one place.

The monitor feeds it (scrapes, probes, stalls); the request path asks it: a snapshot for
routing, a lease per attempt, and the outcome of each attempt. A lease is a context manager, so
the in-flight count it holds is given back on every exit path, cancellation included.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any

from gateway.routing import Backend, BackendLoad, LoadSnapshot, Role
from gateway.routing.curves import Prediction
from gateway.settings import BackendConfig, Settings
from gateway.state import InflightStore
from gateway.telemetry import Telemetry
from gateway.wire import WireAdapter, adapter

__all__ = ["BackendEntry", "ChangeSignal", "Lease", "LiveStatus", "Registry"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LiveStatus:
    """What is known about a backend now."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    spec_acceptance: float | None = None
    scraped_at: float | None = None  # the last good scrape, on the registry's clock
    request_failures: int = 0  # consecutive attempts that failed before their first byte
    ejected: bool = False
    eject_reason: str = ""
    ejected_at: float = 0.0


@dataclass(eq=False)
class BackendEntry:
    backend: Backend
    config: BackendConfig
    adapter: WireAdapter
    inflight_gauge: Any  # tiergate_inflight{tier,backend}
    live: LiveStatus = field(default_factory=LiveStatus)
    # Attempts holding a lease here that have not had their first byte: an ejection cancels
    # them so they move on to the next candidate.
    waiting: set[Lease] = field(default_factory=set)
    # This gateway's leases here over time: their count, and its integral up to `busy_at`, so
    # a request's mean concurrency over any span is a subtraction (the latency model's input).
    busy: int = 0
    busy_area: float = 0.0
    busy_at: float = 0.0
    # TPOT SLOs of the leases here, with counts (routing's harm check reads the tuple).
    slo_counts: dict[float, int] = field(default_factory=dict)
    slos: tuple[tuple[float, int], ...] = ()

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def health_url(self) -> str:
        return self.backend.url + self.adapter.health_path

    @property
    def metrics_url(self) -> str:
        return self.config.scrape_url

    def busy_mark(self, now: float) -> tuple[float, float]:
        """(integral of the lease count up to `now`, `now`): two marks give a mean."""
        return self.busy_area + self.busy * (now - self.busy_at), now

    def count_lease(self, delta: int, slo: float, now: float) -> None:
        self.busy_area += self.busy * (now - self.busy_at)
        self.busy_at = now
        self.busy += delta
        counts = self.slo_counts
        left = counts.get(slo, 0) + delta
        if left > 0:
            counts[slo] = left
        else:
            counts.pop(slo, None)
        self.slos = tuple(counts.items())

    @functools.cached_property
    def auth(self) -> dict[str, str]:
        """The authorization header the backend wants from the gateway (may be empty)."""
        key = self.config.api_key
        return {} if key is None else {"authorization": f"Bearer {key.get_secret_value()}"}


class ChangeSignal:
    """Wakes whoever waits for capacity (admission) when some may have freed; nothing polls.

    A lease given back frees one slot: `notify_one` wakes the longest waiter only, so a release
    costs one routing decision, not one per queued request. New load figures or a backend back
    in rotation may free many: `notify` wakes them all. A waiter that was woken but could not
    use the room waits again at the front, keeping its place.
    """

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    def notify(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, deque()
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def notify_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def wait(self, seconds: float, *, front: bool = False) -> bool:
        """Until woken (True) or `seconds` have passed (False); `front`: ahead of the others."""
        fut = asyncio.get_running_loop().create_future()
        if front:
            self._waiters.appendleft(fut)
        else:
            self._waiters.append(fut)
        try:
            async with asyncio.timeout(seconds):
                await fut
            return True
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.notify_one()  # woken, then gone: the room goes to the next in line
            raise
        finally:
            if not fut.done():
                fut.cancel()
            with contextlib.suppress(ValueError):  # already taken off by a notify
                self._waiters.remove(fut)

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in self._waiters)


class Lease:
    """One attempt's claim on a backend: counted in flight from `with` to its end."""

    __slots__ = ("ejected", "entry", "held", "registry", "slo", "task")

    def __init__(
        self, registry: Registry, entry: BackendEntry, task: asyncio.Task[Any], slo: float
    ) -> None:
        self.registry, self.entry, self.task, self.slo = registry, entry, task, slo
        self.ejected = False  # set when the backend's ejection cancelled this attempt
        self.held = False

    def __enter__(self) -> Lease:
        e = self.entry
        self.registry.store.acquire(e.url)
        e.inflight_gauge.inc()
        e.waiting.add(self)
        e.count_lease(1, self.slo, self.registry.clock())
        self.held = True
        return self

    def first_byte(self) -> None:
        """The engine answered: an ejection no longer moves this attempt elsewhere."""
        self.entry.waiting.discard(self)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.held:
            return
        self.held = False
        e = self.entry
        e.waiting.discard(self)
        self.registry.store.release(e.url)
        e.inflight_gauge.dec()
        e.count_lease(-1, self.slo, self.registry.clock())
        self.registry.changed.notify_one()


class Registry:
    def __init__(
        self,
        settings: Settings,
        store: InflightStore,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.telemetry, self.clock = store, telemetry, clock
        self.eject_after_failures = settings.monitor.eject_after_failures
        # A scrape older than three intervals is old news: routing then trusts only the
        # gateway's own in-flight counts.
        self.stale_after = 3 * settings.monitor.scrape_interval_s
        self.entries: dict[str, BackendEntry] = {}
        for tier in settings.tiers:
            for cfg in tier.backends:
                b = Backend(cfg.url, tier.name, Role(tier.role), frozenset(cfg.models))
                gauge = telemetry.inflight.labels(b.role.value, b.url)
                self.entries[b.url] = BackendEntry(b, cfg, adapter(cfg.kind), gauge)
        self.backends = tuple(e.backend for e in self.entries.values())
        self.models = frozenset(m for b in self.backends for m in b.models)
        # Backends by the models they serve, overall and per role: who could ever serve a
        # request, before health and exclusions.
        serving: dict[tuple[str, Role | None], set[str]] = {}
        for b in self.backends:
            for m in b.models:
                serving.setdefault((m, None), set()).add(b.url)
                serving.setdefault((m, b.role), set()).add(b.url)
        self._serving = {k: frozenset(v) for k, v in serving.items()}
        # Kinds that cannot take every request, with their backends: asked per request.
        kinds: dict[str, tuple[WireAdapter, set[str]]] = {}
        for e in self.entries.values():
            if e.adapter.restricts:
                kinds.setdefault(e.adapter.kind, (e.adapter, set()))[1].add(e.url)
        self.restricted = tuple((a, frozenset(urls)) for a, urls in kinds.values())
        self.changed = ChangeSignal()
        # The latency model's predictions per url, replaced whole by the learner when it learns.
        self.curves: Mapping[str, Prediction] = MappingProxyType({})

    # -- what the request path asks --------------------------------------------------------
    def entry(self, url: str) -> BackendEntry:
        return self.entries[url]

    def __iter__(self) -> Iterator[BackendEntry]:
        return iter(self.entries.values())

    def serving(self, model: str, role: Role | None) -> frozenset[str]:
        return self._serving.get((model, role), frozenset())

    def snapshot(self) -> LoadSnapshot:
        """The immutable view routing decides on: scraped load merged with in-flight counts
        (the freshest signal: the engines' gauges lag by seconds under load)."""
        now = self.clock()
        counts = self.store.counts()
        loads = {
            url: BackendLoad(
                running=(st := e.live).running,
                waiting=st.waiting,
                kv_usage=st.kv_usage,
                inflight=counts.get(url, 0),
                healthy=not st.ejected,
                stale=st.scraped_at is None or now - st.scraped_at > self.stale_after,
                slos=e.slos,
            )
            for url, e in self.entries.items()
        }
        return LoadSnapshot(self.backends, loads, now, self.curves)

    def lease(self, entry: BackendEntry, slo_tpot_s: float = math.inf) -> Lease:
        """A claim on `entry` for one attempt of a request whose TPOT SLO is `slo_tpot_s`."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - the request path always runs in a task
            raise RuntimeError("a lease must be taken inside a task")
        return Lease(self, entry, task, slo_tpot_s)

    def healthy_models(self) -> set[str]:
        return {m for e in self.entries.values() if not e.live.ejected for m in e.backend.models}

    def local_inflight(self, entry: BackendEntry) -> int:
        return self.store.local_counts().get(entry.url, 0)

    # -- outcomes and health ---------------------------------------------------------------
    def request_failed(self, entry: BackendEntry, reason: str) -> None:
        entry.live.request_failures += 1
        if entry.live.request_failures >= self.eject_after_failures:
            self.eject(entry, f"requests_{reason}")

    def request_succeeded(self, entry: BackendEntry) -> None:
        entry.live.request_failures = 0

    def eject(self, entry: BackendEntry, reason: str) -> None:
        """Out of rotation; the attempts waiting there for a first byte move on."""
        st = entry.live
        if st.ejected:
            return
        st.ejected, st.eject_reason, st.ejected_at = True, reason, self.clock()
        b = entry.backend
        self.telemetry.ejections.labels(b.role.value, b.url, reason.split("_")[0]).inc()
        log.warning("backend ejected", extra={"fields": {"backend": b.url, "reason": reason}})
        if entry.waiting:  # leases exist only inside the event loop
            # An attempt whose own failure caused the ejection is already moving on: spare it.
            current = asyncio.current_task()
            for lease in tuple(entry.waiting):
                if lease.task is not current:
                    lease.ejected = True
                    lease.task.cancel()
            entry.waiting.clear()

    def readmit(self, entry: BackendEntry) -> None:
        st = entry.live
        st.ejected, st.request_failures = False, 0
        log.info("backend back in rotation", extra={"fields": {"backend": entry.url}})
        self.changed.notify()
