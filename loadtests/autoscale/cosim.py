"""An elastic deployment on a virtual clock: the gateway's routing, latency model and planner in
front of engines an autoscaler adds and removes, under open-loop traffic.

The routing study's co-simulation (loadtests.routing_sim.cosim) with what autoscaling needs:

- engines: `engines.sim.scheduler.Scheduler`s stepping on their own, as there; each asked for
  at some moment, serving after a start-up drawn from `startup_s` (loading weights: it costs a
  GPU from the moment it is asked for), and, when scaled down, taking no new request and gone
  once its last stream ends (Kubernetes removes the youngest pods first: those still starting,
  then the newest ready);
- the gateway: the real `Registry` (backends join as discovery adds them and leave as it
  removes them), `Monitor.observe` every `scrape_interval_s`, the real `Learner` and the
  default routing policy, built as the gateway builds them; and the real `Planning` (the demand
  per class, the plan every `planner.interval_s`) fed by the same requests;
- the autoscaler: every `sync_s` (the HPA controller's sync period) an arm
  (loadtests.autoscale.arms) reads its metric and a `loadtests.autoscale.hpa.Hpa` per tier
  sets the replicas;
- clients: the arrivals of a trace (loadtests.autoscale.traces), each a stream of its own with
  an SLO class, whatever the state of the deployment (open loop: a slow deployment does not
  slow the arrivals).

Not modelled, and said so: the metric pipeline between an engine and the HPA (Prometheus'
scrape, the adapter's cache) is instantaneous for every arm; the gateway's admission control
(a request goes to the policy's choice whatever its load); failures. Deterministic given the
seed.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engines.sim.profile import load_profile
from engines.sim.scheduler import Scheduler, Sequence
from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import (
    BackendConfig,
    MonitorConfig,
    PlannerConfig,
    PolicyConfig,
    Settings,
    TierConfig,
)
from gateway.core.exchange import Exchange
from gateway.observe.telemetry import Telemetry
from gateway.routing import Role, Slo
from gateway.serve.assembly import core
from gateway.serve.planning import Planning
from loadtests.autoscale.traces import Arrival, Klass, Trace, arrivals
from loadtests.routing_sim.cosim import (
    ENDPOINT,
    MODEL,
    SimEngine,
    client_view,
    commit_step,
    plan_steps,
)

__all__ = ["STARTUP_S", "TIERS", "Replica", "Run", "Scaler", "Served", "Spec", "simulate"]

TIERS = ("latency", "throughput")

# Event kinds, in the order they are handled on one instant: tokens first (a finished request
# counts before anything reads the load), then requests reaching an engine, new requests,
# replicas that finish starting, the monitor's round, the planner, the autoscaler.
_STEP_END, _ARRIVE, _REQUEST, _READY, _SHIFT, _SCRAPE, _PLAN, _SYNC = range(8)


STARTUP_S = (30.0, 120.0)  # a new replica's start-up (s), uniform between the two


@dataclass(frozen=True, slots=True)
class Spec:
    """One run: a deployment, a trace, an autoscaler arm, a seed."""

    latency: str  # the latency tier's engine profile
    throughput: str  # the pool's
    classes: tuple[Klass, ...]
    trace: Trace
    ceiling: float  # one pool replica's completions/s, saturated (the traces' unit)
    arm: str
    seed: int = 0
    start: tuple[int, int] = (1, 2)  # replicas per tier at 0 (serving from the start)
    bounds: tuple[tuple[int, int], tuple[int, int]] = ((1, 4), (2, 10))  # (min, max) per tier
    startup_s: tuple[float, float] = STARTUP_S  # a new replica's start-up, uniform
    sync_s: float = 15.0
    scrape_interval_s: float = 0.25
    prompt_tokens: int = 128
    # (acceptance vector) the latency engines take at the trace's shift.
    shifted_acceptance: tuple[float, ...] | None = None
    planner: PlannerConfig = field(default_factory=PlannerConfig)


@dataclass(slots=True, eq=False)
class Replica:
    """One engine's life: asked for, serving (from then on the gateway knows it: `engine`),
    asked to leave, gone. `done`: (when, end-to-end latency) of its requests lately, which
    the engine's own metrics would show (vllm:e2e_request_latency_seconds,
    vllm:request_success_total)."""

    tier: str
    url: str
    sched: Scheduler
    asked: float
    ready_at: float
    engine: SimEngine | None = None
    leaving: float | None = None
    gone: float | None = None
    done: deque[tuple[float, float]] = field(default_factory=deque)

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def gpu_s(self, now: float) -> float:
        return (self.gone if self.gone is not None else now) - self.asked


@dataclass(frozen=True, slots=True)
class Served:
    """One finished request."""

    klass: int
    arrived: float
    tier: str
    ttft: float
    tpot: float
    met: bool
    e2e: float


@dataclass(slots=True)
class Run:
    spec: Spec
    served: list[Served]
    sent: int
    # (t, replicas asked for per tier (starting or serving), serving per tier) at every sync.
    timeline: list[tuple[float, tuple[int, int], tuple[int, int]]]
    gpu_s: tuple[float, float]  # per tier
    wall_s: float
    unfinished: int


class Scaler:
    """What an arm is: each sync, the replicas it wants per tier, from the run's state."""

    def desired(self, sim: Elastic, now: float) -> tuple[int, int]:
        raise NotImplementedError


@dataclass(slots=True, eq=False)
class _Request:
    ex: Exchange
    klass: int
    replica: Replica
    seq: Sequence


async def _discard(_message: Any) -> None:
    return None


class Elastic:
    def __init__(self, spec: Spec, scaler: Callable[[Elastic], Scaler]) -> None:
        self.spec = spec
        self.now = 0.0
        self.events: list[tuple[float, int, int, Any]] = []
        self._n = 0
        tiers = [
            TierConfig.model_validate({
                "name": name, "role": name,
                "discovery": {"file": {"path": f"/nonexistent/{name}.yaml"},
                              "backend": {"models": [MODEL]}},
                "replicas": {"minimum": lo, "maximum": hi},
            })
            for name, (lo, hi) in zip(TIERS, spec.bounds, strict=True)
        ]  # fmt: skip
        self.settings = Settings(
            tiers=tiers,
            policy=PolicyConfig.model_validate({"seed": spec.seed}),
            monitor=MonitorConfig(scrape_interval_s=spec.scrape_interval_s),
            planner=spec.planner,
        )
        telemetry = Telemetry()
        self.store = MemoryInflightStore()
        self.registry = Registry(self.settings, self.store, telemetry, self.clock)
        parts = core(self.settings, self.registry, None, True)
        self.learner, self.monitor, self.router = parts.learner, parts.monitor, parts.router
        self.planning = Planning(spec.planner, tiers, self.registry, telemetry, self.clock)
        self.profiles = {"latency": load_profile(spec.latency),
                         "throughput": load_profile(spec.throughput)}  # fmt: skip
        self.rng = random.Random(spec.seed * 104_729 + 17)
        self.replicas: list[Replica] = []
        self.by_url: dict[str, Replica] = {}
        self.shifted: tuple[float, ...] | None = None  # the latency engines' vector, shifted
        self._made = 0
        self.requests: dict[Sequence, _Request] = {}
        self.served: list[Served] = []
        self.sent = 0
        self.ended = 0.0  # when the last request finished
        self.timeline: list[tuple[float, tuple[int, int], tuple[int, int]]] = []
        self.dirty: set[SimEngine] = set()
        self.arrivals: Iterator[Arrival] = arrivals(spec.trace, spec.classes, spec.ceiling,
                                                    spec.seed)  # fmt: skip
        self.slos = tuple(Slo(c.ttft_s, c.tpot_s) for c in spec.classes)
        self.scaler = scaler(self)

    def clock(self) -> float:
        return self.now

    def push(self, at: float, kind: int, payload: Any = None) -> None:
        self._n += 1
        heapq.heappush(self.events, (at, kind, self._n, payload))

    # -- replicas ----------------------------------------------------------------------------
    def tier_replicas(self, tier: str) -> list[Replica]:
        """The tier's replicas asked for and not asked to leave, oldest first."""
        return [r for r in self.replicas if r.tier == tier and r.leaving is None]

    def add(self, tier: str, ready_in: float) -> None:
        profile = self.profiles[tier]
        url = f"http://{tier}-{self._made}.sim"
        sched = Scheduler(profile, random.Random(self.spec.seed * 7919 + self._made))
        if tier == "latency" and self.shifted is not None:
            sched.acceptance = self.shifted
        self._made += 1
        r = Replica(tier, url, sched, self.now, self.now + ready_in)
        self.replicas.append(r)
        self.by_url[url] = r
        self.push(r.ready_at, _READY, r)

    def remove(self, tier: str) -> None:
        """One replica of `tier` goes: the youngest still starting, else the youngest serving."""
        mine = self.tier_replicas(tier)
        starting = [r for r in mine if not r.ready]
        r = (starting or mine)[-1]
        r.leaving = self.now
        if r.engine is None:
            r.gone = self.now  # its start-up cancelled: the GPU is free at once
            return
        self.registry.leave(r.url)
        if not r.engine.entry.busy:
            r.gone = self.now

    def scale(self, tier: str, want: int) -> None:
        have = len(self.tier_replicas(tier))
        lo, hi = self.spec.startup_s
        for _ in range(want - have):
            self.add(tier, self.rng.uniform(lo, hi))
        for _ in range(have - want):
            self.remove(tier)

    def ready(self, r: Replica) -> None:
        """Started: discovery adds it (routable after the monitor's first good scrape)."""
        if r.leaving is not None:
            return
        entry = self.registry.join(r.tier, Role(r.tier), BackendConfig(url=r.url, models=[MODEL]))
        r.engine = SimEngine(entry, self.profiles[r.tier], r.sched)

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> None:
        spec = self.spec
        for tier, n in zip(TIERS, spec.start, strict=True):
            for _ in range(n):
                self.add(tier, 0.0)
        if spec.trace.shift_at is not None and spec.shifted_acceptance is not None:
            self.push(spec.trace.shift_at, _SHIFT, spec.shifted_acceptance)
        self.push(0.0, _SCRAPE)
        self.push(0.0, _PLAN)
        self.push(0.0, _SYNC)
        self.next_arrival()
        events = self.events
        while events:
            at, kind, _n, payload = heapq.heappop(events)
            self.now = at
            if kind == _STEP_END:
                engine, step = payload
                self.dirty.add(engine)
                for done in commit_step(engine, step, at, self.requests):
                    self.finish(done)
            elif kind == _ARRIVE:
                req: _Request = payload
                req.seq.arrival = at
                req.replica.sched.add(req.seq)
                assert req.replica.engine is not None
                self.dirty.add(req.replica.engine)
            elif kind == _REQUEST:
                self.send(payload)
                self.next_arrival()
            elif kind == _READY:
                self.ready(payload)
            elif kind == _SHIFT:
                for r in self.replicas:
                    if r.tier == "latency":
                        r.sched.acceptance = payload
                self.shifted = payload
            elif kind == _SCRAPE:
                self.scrape()
            elif kind == _PLAN:
                self.planning.step()
                if self.going():
                    self.push(at + spec.planner.interval_s, _PLAN)
            else:
                self.sync()
            if self.dirty and (not events or events[0][0] > at):
                self.kick()

    def going(self) -> bool:
        return self.now < self.spec.trace.duration_s or bool(self.requests)

    def next_arrival(self) -> None:
        a = next(self.arrivals, None)
        if a is not None:
            self.push(a.at, _REQUEST, a)

    def kick(self) -> None:
        for e, step in plan_steps(self.dirty, self.now):
            self.push(self.now + step.duration, _STEP_END, (e, step))

    def scrape(self) -> None:
        now = self.now
        for r in self.replicas:
            if r.engine is not None and r.gone is None:
                self.monitor.observe(r.engine.entry, r.engine.stats(), now)
        self.learner.refresh()
        if self.going():
            self.push(now + self.spec.scrape_interval_s, _SCRAPE)

    def sync(self) -> None:
        want = self.scaler.desired(self, self.now)
        for tier, n in zip(TIERS, want, strict=True):
            self.scale(tier, n)
        self.timeline.append((self.now, self.counts(ready=False), self.counts(ready=True)))
        if self.now < self.spec.trace.duration_s:
            self.push(self.now + self.spec.sync_s, _SYNC)

    def counts(self, *, ready: bool) -> tuple[int, int]:
        def n(tier: str) -> int:
            return sum(1 for r in self.tier_replicas(tier) if r.ready or not ready)

        return n("latency"), n("throughput")

    def send(self, a: Arrival) -> None:
        now = self.now
        self.sent += 1
        ex = Exchange(str(self.sent), ENDPOINT, {}, _discard, now, model=MODEL, stream=True,
                      slo=self.slos[a.klass])  # fmt: skip
        self.planning.arrived(ex)
        router, registry = self.router, self.registry
        req, snap = ex.route_request(), registry.snapshot()
        decision = router.policy(req, snap, router.state, router.rng)
        router.state = decision.state
        ex.decision = decision
        backend = decision.primary
        assert backend is not None, "a tier keeps one replica serving at least"
        entry = registry.entry(backend.url)
        replica = self.by_url[backend.url]
        engine = replica.engine
        assert engine is not None, "routing sees only replicas that serve"
        self.store.acquire(entry.url)
        entry.count_lease(1, ex.slo.tpot_s, now)
        ex.joined_at_load = entry.busy
        ex.attempts, ex.backend, ex.status = 1, backend, 200
        seq = Sequence(ex.id, self.spec.prompt_tokens, a.output_tokens, now)
        r = _Request(ex, a.klass, replica, seq)
        self.requests[seq] = r
        delay = engine.profile.cost.frontend_delay_s(len(engine.sched.running))
        self.push(now + delay, _ARRIVE, r)

    def finish(self, req: _Request) -> None:
        now, ex, replica = self.now, req.ex, req.replica
        assert replica.engine is not None
        entry = replica.engine.entry
        ex.output_tokens = req.seq.generated
        self.store.release(entry.url)
        entry.count_lease(-1, ex.slo.tpot_s, now)
        self.learner.finished(ex)
        self.planning.finished(ex)
        self.registry.forget_if_idle(entry)
        if replica.leaving is not None and not entry.busy:
            replica.gone = now
        del self.requests[req.seq]
        ttft, tpot, met = client_view(ex)
        self.ended = now
        self.served.append(Served(req.klass, ex.started, replica.tier, ttft, tpot, met,
                                  now - ex.started))  # fmt: skip
        replica.done.append((now, now - ex.started))


def simulate(spec: Spec, scaler: Callable[[Elastic], Scaler]) -> Run:
    """Run one trace to its end (every request finished)."""
    t0 = time.perf_counter()
    sim = Elastic(spec, scaler)
    sim.run()
    # The replicas left at the end are counted to the end of the trace or of its last request.
    end = max(spec.trace.duration_s, sim.ended)
    gpu = tuple(sum(r.gpu_s(end) for r in sim.replicas if r.tier == t) for t in TIERS)
    return Run(spec, sim.served, sim.sent, sim.timeline, (gpu[0], gpu[1]),
               time.perf_counter() - t0, len(sim.requests))  # fmt: skip
