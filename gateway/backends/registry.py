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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any

from gateway.backends.outlier import Mode, OutlierState, Verdict
from gateway.backends.state import InflightStore
from gateway.config.settings import BackendConfig, Settings, kind_options
from gateway.observe.telemetry import Telemetry
from gateway.routing import Backend, BackendLoad, LoadSnapshot, Role
from gateway.routing.curves import Prediction
from gateway.routing.types import by_tier
from gateway.wire import EngineKind, OwnTransport, WireAdapter
from gateway.wire.kinds import BUILTIN

__all__ = ["BackendEntry", "ChangeSignal", "Lease", "LiveStatus", "Registry"]

# Priorities (gateway.pipeline.tenants): a request of at least the first may take the place of one
# of at most the second that has not had its first byte (interactive over batch).
DISPLACING_RANK = 2
DISPLACEABLE_RANK = 0
# The time constant of a class's mean count of leases on a backend: about a minute, the span over
# which demand is read for planning too; long against a request, short against a day's cycle.
CLASS_MEMORY_S = 60.0
# A class whose mean fell below this with none in flight is forgotten.
_FORGOTTEN = 0.01

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LiveStatus:
    """What is known about a backend now."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    spec_acceptance: float | None = None
    scraped_at: float | None = None  # the last good scrape, on the registry's clock
    inflight_at_scrape: int = 0  # requests in flight through the gateway then
    down: bool = False  # the load monitor found it dead or stalled
    ejected: bool = False  # out of rotation: down, or ejected for its requests' outcomes
    eject_reason: str = ""
    ejected_at: float = 0.0


@dataclass(eq=False)
class BackendEntry:
    backend: Backend
    config: BackendConfig
    kind: EngineKind
    options: Any  # the backend's options, an instance of its kind's model
    inflight: tuple[Any, ...]  # its tiergate_inflight series (Telemetry.add)
    # The hard cap a lease checks as it takes its slot: a latency backend's when several
    # workers share the counts (another may take the last slot between a decision and its
    # lease); None: the decision's view is enough (one process decides and leases in one step).
    cap: int | None = None
    live: LiveStatus = field(default_factory=LiveStatus)
    outlier: OutlierState = field(default_factory=OutlierState)
    # Attempts holding a lease here that have not had their first byte: an ejection cancels
    # them so they move on to the next candidate.
    waiting: set[Lease] = field(default_factory=set)
    # Attempts streaming from here: an ejection, or their engine going silent, cuts them.
    streaming: set[Lease] = field(default_factory=set)
    # This gateway's leases here over time: their count, and its integral up to `busy_at`, so
    # a request's mean concurrency over any span is a subtraction (the latency model's input);
    # and the integral of its square: over a span, square / area is the count as the streams
    # themselves saw it (each weighs by how many were there), as an engine's inter-token
    # samples (one per stream per step) saw it.
    busy: int = 0
    busy_area: float = 0.0
    busy_square: float = 0.0
    busy_at: float = 0.0
    # TPOT SLOs of the leases here, with counts (routing's harm check reads the tuple).
    slo_counts: dict[float, int] = field(default_factory=dict)
    slos: tuple[tuple[float, int], ...] = ()
    # Per TPOT SLO, its mean count of leases here lately (CLASS_MEMORY_S), as of the last
    # change: routing keeps room for a tighter class that is often not in flight at the instant
    # it decides (a class that arrives rarely).
    slo_recent: dict[float, float] = field(default_factory=dict)
    recent: tuple[tuple[float, float], ...] = ()
    # How requests reach it: its kind's own transport where it brings one (Triton's gRPC
    # stream), else the gateway's HTTP pool, which gateway.pipeline.upstream sets.
    own_transport: OwnTransport | None = None
    # Found by discovery; and when discovery lost it (registry clock): no new requests from
    # then on, forgotten once idle.
    discovered: bool = False
    left_at: float | None = None

    @functools.cached_property
    def adapter(self) -> WireAdapter:
        return self.kind.adapter

    @property
    def models(self) -> list[str]:
        return self.config.models

    @functools.cached_property  # read several times a request: a property is a call each
    def url(self) -> str:
        return self.backend.url

    @functools.cached_property
    def served_by(self) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
        """The headers that tell a client which tier and backend answered (made once)."""
        b = self.backend
        return (b"x-tiergate-tier", b.role.value.encode()), (b"x-tiergate-backend", b.url.encode())

    @property
    def on_probation(self) -> bool:
        """Back after an ejection for its outcomes: one request at a time (backends.outlier)."""
        return self.outlier.mode is Mode.PROBATION

    @property
    def health_url(self) -> str:
        return self.backend.url + (self.config.health_path or self.adapter.health_path)

    @property
    def metrics_url(self) -> str:
        return self.config.scrape_url

    def busy_mark(self, now: float) -> tuple[float, float]:
        """(integral of the lease count up to `now`, `now`): two marks give a mean."""
        return self.busy_area + self.busy * (now - self.busy_at), now

    def load_marks(self, now: float) -> tuple[float, float, int]:
        """(integral of the lease count, of its square) up to `now`, and the count."""
        held, busy = now - self.busy_at, self.busy
        return self.busy_area + busy * held, self.busy_square + busy * busy * held, busy

    def count_lease(self, delta: int, slo: float, now: float) -> None:
        counts, recent = self.slo_counts, self.slo_recent
        held, busy = now - self.busy_at, self.busy
        if held > 0:
            # Each class's count held since the last change: fold it into its mean (every
            # class counted has one, from when it was first counted: below).
            kept = math.exp(-held / CLASS_MEMORY_S)
            for s, mean in tuple(recent.items()):  # a copy: recent may change
                mean = mean * kept + counts.get(s, 0) * (1.0 - kept)
                if mean < _FORGOTTEN and s not in counts:
                    del recent[s]
                else:
                    recent[s] = mean
            self.recent = tuple(sorted(recent.items()))
        self.busy_area += busy * held
        self.busy_square += busy * busy * held
        self.busy_at = now
        self.busy = busy + delta
        left = counts.get(slo, 0) + delta
        if left > 0:
            counts[slo] = left
            if slo not in recent:
                recent[slo] = 0.0
        else:
            counts.pop(slo, None)
        # Tightest first: a decision sees at the first whether a tighter class is in flight.
        self.slos = tuple(sorted(counts.items()))

    @functools.cached_property
    def auth(self) -> dict[str, str]:
        """The authorization header the backend wants from the gateway (may be empty)."""
        key = self.config.api_key
        return {} if key is None else {"authorization": f"Bearer {key.get_secret_value()}"}


@dataclass(eq=False, slots=True)
class _Waiter:
    fut: asyncio.Future[None]
    rank: int  # priority: higher first
    tenant: str
    seq: int  # arrival order; negative: went back to the front


class ChangeSignal:
    """Wakes whoever waits for capacity (admission) when some may have freed; nothing polls.

    A lease given back frees one slot: `notify_one` wakes one waiter only, so a release costs
    one routing decision, not one per queued request. New load figures or a backend back in
    rotation may free many: `notify` wakes them all, in the same order. The order: higher
    priority first; within one, the tenant woken fewest times (round-robin over tenants, so one
    tenant's flood cannot keep another's requests waiting: deficit round-robin with a cost of one
    request); within one tenant, first come first served. A waiter that was woken but could not
    use the room waits again at the front of its place. With one priority and one tenant (no
    tenants configured, or priorities off) that is plain FIFO.
    """

    __slots__ = ("_seq", "_turns", "_waiters")

    def __init__(self) -> None:
        self._waiters: list[_Waiter] = []
        self._turns: dict[str, int] = {}  # times each tenant was woken while others waited
        self._seq = 0

    def _key(self, w: _Waiter) -> tuple[int, int, int]:
        return -w.rank, self._turns.get(w.tenant, 0), w.seq

    def notify(self) -> None:
        if self._waiters:
            waiters, self._waiters = sorted(self._waiters, key=self._key), []
            for w in waiters:
                if not w.fut.done():
                    w.fut.set_result(None)

    def notify_one(self) -> None:
        while self._waiters:
            w = min(self._waiters, key=self._key)
            self._waiters.remove(w)
            if not w.fut.done():
                self._turns[w.tenant] = self._turns.get(w.tenant, 0) + 1
                w.fut.set_result(None)
                return

    async def wait(
        self, seconds: float, *, front: bool = False, rank: int = 0, tenant: str = ""
    ) -> bool:
        """Until woken (True) or `seconds` have passed (False); `front`: ahead of the others
        of its priority and tenant."""
        fut = asyncio.get_running_loop().create_future()
        self._seq += 1
        if not self._waiters:
            self._turns.clear()  # a new busy period: nobody owes anybody
        elif tenant not in self._turns:
            # A tenant joining a queue starts level with the least served one waiting, not
            # at zero, so it takes its share from now on, not everything until it catches up.
            self._turns[tenant] = min(self._turns.get(w.tenant, 0) for w in self._waiters)
        w = _Waiter(fut, rank, tenant, -self._seq if front else self._seq)
        self._waiters.append(w)
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
                self._waiters.remove(w)

    @property
    def waiting(self) -> int:
        return sum(not w.fut.done() for w in self._waiters)


class Lease:
    """One attempt's claim on a backend: counted in flight from `with` to its end."""

    __slots__ = ("cut", "displaced", "ejected", "entry", "gone", "held", "last_io", "on_cut",
                 "rank", "registry", "slo", "task")  # fmt: skip

    def __init__(
        self, registry: Registry, entry: BackendEntry, task: asyncio.Task[Any], slo: float
    ) -> None:
        self.registry, self.entry, self.task, self.slo = registry, entry, task, slo
        self.ejected = False  # set when the backend's ejection cancelled this attempt
        self.gone = False  # set when the backend's leaving the pool cancelled it
        # Its request's priority (gateway.pipeline.tenants), and whether a request of a higher one
        # took its place before its first byte (`Registry.displace`).
        self.rank = 1
        self.displaced = False
        self.held = False
        # Why the gateway cut this attempt's stream ("ejected", "idle"), and when its engine
        # last sent something (the stream watchdog's clock, set by the relay).
        self.cut: str | None = None
        self.last_io = 0.0
        self.on_cut: Callable[[], None] | None = None

    def __enter__(self) -> Lease:
        """Count the attempt in flight. On a capped backend (`BackendEntry.cap`) that routing
        last saw below its cap, only while it still is: otherwise `held` stays False, nothing
        is counted, and the attempt must not go (upstream passes the backend over)."""
        e, reg = self.entry, self.registry
        if e.cap is None or reg.seen.get(e.url, 0) >= e.cap:
            reg.store.acquire(e.url)
        elif not reg.store.try_acquire(e.url, e.cap):
            return self
        reg.telemetry.add(e.inflight, 1.0)
        e.waiting.add(self)
        e.count_lease(1, self.slo, self.registry.clock())
        self.held = True
        return self

    def first_byte(self, now: float, on_cut: Callable[[], None]) -> None:
        """The engine answered: from here an ejection or silence cuts the stream instead, by
        `on_cut` (closing the engine's response: the relay's next read fails at once)."""
        e = self.entry
        e.waiting.discard(self)
        self.last_io, self.on_cut = now, on_cut
        e.streaming.add(self)

    def cut_stream(self, why: str) -> None:
        """End this attempt's stream; the relay sees its read fail, and `cut` says why. (Not
        by cancelling the task: a cancellation that lands after the read had already failed
        would stay pending and hit whatever the task awaits next, the stream's continuation.)"""
        if self.cut is None and self.on_cut is not None:
            self.cut = why
            self.on_cut()

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
        e.streaming.discard(self)
        self.registry.store.release(e.url)
        self.registry.telemetry.add(e.inflight, -1.0)
        e.count_lease(-1, self.slo, self.registry.clock())
        self.registry.changed.notify_one()
        if e.left_at is not None:
            self.registry.forget_if_idle(e)


class Registry:
    def __init__(
        self,
        settings: Settings,
        store: InflightStore,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
        kinds: Mapping[str, EngineKind] = BUILTIN,
    ) -> None:
        """`kinds`: the engine kinds backends' `kind` names (checked by the configuration:
        gateway.config.settings.kind_problems)."""
        self.store, self.telemetry, self.clock = store, telemetry, clock
        self.kinds, self.timeout_s = kinds, settings.request_timeout_s
        self.outlier_cfg = settings.outlier
        # A scrape older than three intervals is old news: routing then trusts only the
        # gateway's own in-flight counts.
        self.stale_after = 3 * settings.monitor.scrape_interval_s
        self.cap = settings.policy.latency_hard_cap if settings.workers > 1 else None
        self.entries: dict[str, BackendEntry] = {}
        for tier in settings.tiers:
            for cfg in tier.backends:
                self._add(tier.name, Role(tier.role), cfg)
        # The in-flight counts of the last snapshot routing got: a lease enforces a backend's
        # cap only where that count was below it (a policy that knowingly goes past the cap,
        # as the tier-blind and single-tier baselines do, is not second-guessed).
        self.seen: Mapping[str, int] = {}
        # Every model a tier serves, listed or to be discovered.
        self.models = frozenset(m for tier in settings.tiers for m in tier.models)
        # Own transports of backends forgotten, for the discovery's loop to close.
        self.closing: list[OwnTransport] = []
        self.generation = 0  # counts the changes of membership (joins, leaves, forgets)
        self._derive()
        self.changed = ChangeSignal()
        # Set when discovery adds a backend: the monitor probes it at once rather than at its
        # next round, so that it takes requests as soon as it answers.
        self.arrived = asyncio.Event()
        # The latency model's predictions per url, replaced whole by the learner when it learns.
        self.curves: Mapping[str, Prediction] = MappingProxyType({})

    # -- membership -------------------------------------------------------------------------
    def _add(self, tier: str, role: Role, cfg: BackendConfig) -> BackendEntry:
        b = Backend(cfg.url, tier, role, frozenset(cfg.models))
        t = self.telemetry
        inflight = (t.inflight, b.role.value, b.url)
        t.child(*inflight)  # the series at 0 from the start
        kind = self.kinds[cfg.kind]
        entry = self.entries[b.url] = BackendEntry(b, cfg, kind, kind_options(cfg, kind), inflight)
        entry.own_transport = kind.transport(entry, self.timeout_s)
        if b.role is Role.LATENCY:
            entry.cap = self.cap
        return entry

    def _derive(self) -> None:
        """What follows from the membership: the backends routing sees (not those that left),
        who serves what, the kinds to ask."""
        self.generation += 1
        self.backends = tuple(e.backend for e in self.entries.values() if e.left_at is None)
        self.tiers = by_tier(self.backends)  # (every snapshot's, grouped once)
        # Backends by the models they serve, overall and per role: who could ever serve a
        # request, before health and exclusions.
        serving: dict[tuple[str, Role | None], set[str]] = {}
        for b in self.backends:
            for m in b.models:
                serving.setdefault((m, None), set()).add(b.url)
                serving.setdefault((m, b.role), set()).add(b.url)
        self._serving = {k: frozenset(v) for k, v in serving.items()}
        # Kinds that cannot take every request, with their backends: asked per request.
        restricting: dict[str, tuple[WireAdapter, set[str]]] = {}
        for b in self.backends:
            adapter = self.entries[b.url].adapter
            if adapter.restricts:
                restricting.setdefault(adapter.kind, (adapter, set()))[1].add(b.url)
        self.restricted = tuple((a, frozenset(urls)) for a, urls in restricting.values())

    def join(self, tier: str, role: Role, cfg: BackendConfig) -> BackendEntry:
        """A backend discovery found: out of rotation until the monitor's first good probe
        (a backend that had left and is back takes requests again at once)."""
        entry = self.entries.get(cfg.url)
        if entry is not None:
            if entry.left_at is not None:
                entry.left_at = None
                self._derive()
                log.info("backend back in discovery", extra={"fields": {"backend": cfg.url}})
            return entry
        entry = self._add(tier, role, cfg)
        entry.discovered = True
        st = entry.live
        st.down = st.ejected = True
        st.eject_reason, st.ejected_at = "joining", self.clock()
        self._derive()
        self.arrived.set()
        log.info("backend joined", extra={"fields": {"backend": cfg.url, "tier": tier}})
        return entry

    def leave(self, url: str) -> None:
        """A backend gone from discovery: no new request from now on; the attempts waiting
        there for a first byte move on, its streams may finish (`cut_left`), and it is
        forgotten when its last lease ends."""
        entry = self.entries.get(url)
        if entry is None or entry.left_at is not None or not entry.discovered:
            return  # (a listed backend stays, whatever a source says)
        entry.left_at = self.clock()
        self._derive()
        log.info("backend left", extra={"fields": {
            "backend": url, "streams": len(entry.streaming)}})  # fmt: skip
        self._move_waiting(entry, gone=True)
        self.forget_if_idle(entry)

    def joining(self, model: str) -> bool:
        """Whether a backend of `model` found by discovery waits for its first probe."""
        return any(e.live.eject_reason == "joining" and e.live.down and e.left_at is None
                   and model in e.backend.models for e in self.entries.values())  # fmt: skip

    def forget_if_idle(self, entry: BackendEntry) -> None:
        """Forget a backend that left once nothing of this gateway runs there: its entry, its
        metrics series, its in-flight count."""
        if entry.left_at is None or entry.busy or self.entries.get(entry.url) is not entry:
            return
        del self.entries[entry.url]
        if entry.own_transport is not None:
            self.closing.append(entry.own_transport)
        self.telemetry.forget_backend(entry.url)
        self.generation += 1
        log.info("backend forgotten", extra={"fields": {"backend": entry.url}})

    def cut_left(self, drain_s: float) -> int:
        """Cut the streams still running on backends that left more than `drain_s` ago (they
        continue on another backend). Returns how many."""
        now, cut = self.clock(), 0
        for e in tuple(self.entries.values()):
            if e.left_at is not None and now - e.left_at >= drain_s:
                for lease in tuple(e.streaming):
                    if lease.cut is None:
                        lease.cut_stream("left")
                        cut += 1
        return cut

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
        self.seen = counts = self.store.counts()
        # (BackendLoad's fields by position, in its order: by keyword the call costs twice.)
        loads = {
            url: BackendLoad(
                (st := e.live).running,
                st.waiting,
                st.kv_usage,
                counts.get(url, 0),  # inflight
                # Healthy; on probation: routable while no request of ours waits there for its
                # first byte (a trial at a time: the first byte is the trial's success).
                not st.ejected and not (e.waiting and e.on_probation),
                st.scraped_at is None or now - st.scraped_at > self.stale_after,  # stale
                e.slos,
                e.recent,
                st.inflight_at_scrape,
            )
            for url, e in self.entries.items()
            if e.left_at is None
        }
        return LoadSnapshot(self.backends, loads, now, self.curves, distinct=True, tiers=self.tiers)

    def lease(
        self,
        entry: BackendEntry,
        slo_tpot_s: float = math.inf,
        task: asyncio.Task[Any] | None = None,
    ) -> Lease:
        """A claim on `entry` for one attempt of a request whose TPOT SLO is `slo_tpot_s`, made
        by `task` (an ejection cancels it; default: the current task, which the request path
        passes in because looking it up costs more than the rest of this call)."""
        if task is None:
            task = asyncio.current_task()
            if task is None:  # pragma: no cover - the request path always runs in a task
                raise RuntimeError("a lease must be taken inside a task")
        return Lease(self, entry, task, slo_tpot_s)

    def displace(self, candidates: Iterable[Backend], rank: int) -> Backend | None:
        """Make room for a request of priority `rank` among `candidates`: cancel the attempt
        of a batch-class request (priority 0 or below) still waiting there for its first byte,
        which goes back to admission and waits its turn (upstream: `Displaced`), never lost.
        Only an interactive-class request (priority 2 or above) displaces. The backend whose
        place it gets, or None."""
        if rank < DISPLACING_RANK:
            return None
        victim: Lease | None = None
        for b in candidates:
            e = self.entries.get(b.url)
            for lease in e.waiting if e is not None else ():
                if lease.rank <= DISPLACEABLE_RANK and (victim is None or lease.rank < victim.rank):
                    victim = lease
        if victim is None:
            return None
        victim.displaced = True
        victim.entry.waiting.discard(victim)
        victim.task.cancel()
        b = victim.entry.backend
        self.telemetry.child(self.telemetry.displaced, b.role.value, b.url).inc()
        return b

    def healthy_models(self) -> set[str]:
        return {m for e in self.entries.values() if not e.live.ejected and e.left_at is None
                for m in e.backend.models}  # fmt: skip

    def inflight(self, entry: BackendEntry) -> int:
        """Requests in flight at `entry` through the gateway (every replica's, as known)."""
        return self.store.counts().get(entry.url, 0)

    def local_inflight(self, entry: BackendEntry) -> int:
        return self.store.local_counts().get(entry.url, 0)

    # -- outcomes and health ---------------------------------------------------------------
    def request_failed(self, entry: BackendEntry, reason: str, *, fatal: bool = False) -> None:
        """An attempt here failed (before or after its first byte); `fatal`: the engine refused
        the gateway's credentials."""
        verdict = entry.outlier.failed(self.outlier_cfg, self.clock(), fatal=fatal)
        if verdict is not Verdict.EJECT:
            return
        if not self._may_eject(entry):
            entry.outlier.spared()
            return
        seconds = entry.outlier.eject(self.outlier_cfg, self.clock())
        self._out(entry, f"requests_{reason}", f"for {seconds:g} s")

    def request_succeeded(self, entry: BackendEntry) -> None:
        if entry.outlier.succeeded(self.outlier_cfg, self.clock()) is Verdict.READMIT:
            log.info("backend passed probation", extra={"fields": {"backend": entry.url}})

    def _may_eject(self, entry: BackendEntry) -> bool:
        """At most `max_ejected_share` of the backend's tier out for its outcomes, one at least."""
        tier = [e for e in self.entries.values() if e.backend.tier == entry.backend.tier]
        out = sum(e.outlier.mode is Mode.EJECTED for e in tier)
        return out == 0 or (out + 1) / len(tier) <= self.outlier_cfg.max_ejected_share

    def tick(self) -> None:
        """Ejections for outcomes that ran out: those backends go on probation."""
        now = self.clock()
        for e in self.entries.values():
            if e.outlier.tick(now):
                self._update(e)
                log.info("backend on probation", extra={"fields": {"backend": e.url}})

    def eject(self, entry: BackendEntry, reason: str) -> None:
        """The load monitor found the backend dead or stalled: out until a good probe."""
        if not entry.live.down:
            entry.live.down = True
            self._out(entry, reason, "until a good probe")

    def readmit(self, entry: BackendEntry) -> None:
        """A good probe: back, unless ejected for its outcomes (that runs its own course)."""
        st = entry.live
        if st.down:
            st.down = False
            self._update(entry)
            if not st.ejected:
                log.info("backend back in rotation", extra={"fields": {"backend": entry.url}})

    def _update(self, entry: BackendEntry) -> None:
        st = entry.live
        was, st.ejected = st.ejected, st.down or entry.outlier.mode is Mode.EJECTED
        if was and not st.ejected:
            self.changed.notify()

    def _out(self, entry: BackendEntry, reason: str, how_long: str) -> None:
        """Out of rotation: what was scraped is forgotten (its load is unknown now), the
        attempts waiting there for a first byte move on, and its streams are cut."""
        st, b = entry.live, entry.backend
        again = st.eject_reason == reason  # the same cause as last time: logged once
        st.eject_reason, st.ejected_at = reason, self.clock()
        self._update(entry)
        st.running = st.waiting = 0
        st.kv_usage, st.scraped_at = 0.0, None
        self.telemetry.ejections.labels(b.role.value, b.url, reason.split("_")[0]).inc()
        level = logging.DEBUG if again else logging.WARNING
        log.log(level, "backend ejected", extra={"fields": {
            "backend": b.url, "reason": reason, "out": how_long}})  # fmt: skip
        self._move_waiting(entry)
        for lease in tuple(entry.streaming):
            lease.cut_stream("ejected")

    @staticmethod
    def _move_waiting(entry: BackendEntry, gone: bool = False) -> None:
        """The attempts waiting at `entry` for a first byte move on to the next candidate
        (`gone`: the backend left the pool, which is no failure of theirs)."""
        if entry.waiting:  # leases exist only inside the event loop
            # An attempt whose own failure caused the ejection is already moving on: spare it.
            current = asyncio.current_task()
            for lease in tuple(entry.waiting):
                if lease.task is not current:
                    lease.ejected, lease.gone = not gone, gone
                    lease.task.cancel()
            entry.waiting.clear()

    def cut_idle(self, now: float, idle_s: float) -> int:
        """Cut the streams whose engine has sent nothing for `idle_s` (on the relay's clock);
        each counts as its backend's failure. Returns how many."""
        cut = 0
        for e in self.entries.values():
            for lease in tuple(e.streaming):
                if lease.cut is None and now - lease.last_io > idle_s:
                    lease.cut_stream("idle")
                    self.request_failed(e, "idle")
                    cut += 1
        return cut
