"""The gateway's routing and latency model driving the simulator's scheduler, on a virtual clock.

A discrete-event simulation of one gateway in front of one latency engine and a throughput
pool, with no HTTP and no real time, so that a routing study of hundreds of runs takes minutes:

- engines: one `engines.sim.scheduler.Scheduler` per backend, each stepping on its own
  (`plan(now)`, the step's duration later `commit(step, end)`); a request reaches its scheduler
  after the profile's front-end delay, and the gauges a scrape reads are those published at the
  last plan, as `engines.sim.engine` does; the inter-token latency histogram gets one sample per
  emission after a request's first (the step's duration for a request decoding every step);
- the gateway: the real `Registry` (in-flight leases, their integral and TPOT SLOs, the
  snapshot routing reads), `Monitor.observe` every `scrape_interval_s` with what the engine's
  metrics page would say, the real `Learner` (scrapes and finished streams in, predictions out)
  and the routing policy built by `build_policy`, called as `gateway.pipeline.router.Router` calls
  it;
- users: the closed loop of `loadtests.harness.phases` (a user active in a phase sends its next
  request as soon as its last one finished; a request belongs to the phase in which it
  finished). Each request a prompt of its own (`turns` 1), or a turn of a conversation (`turns`
  2 and more): a system prompt every conversation shares, then each turn resends the history
  (earlier questions and answers) and a new question, so the engines' prefix caches (the
  scheduler's, on) serve what an instance has seen of it; the gateway's prefix affinity
  (`gateway.pipeline.homes` and the router's affinity stage, as `Router.decide` applies it)
  sends a conversation back where it was served.

The gateway's admission control is not modelled: a decision whose reason is `saturated` still
goes to its primary (counted). No failures, so no retries. The latency model is fed only when
the policy reads it (`learned`); the others would ignore it. Deterministic given the seed.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from engines.sim.prefix import block_hashes
from engines.sim.profile import Profile, load_profile
from engines.sim.scheduler import Scheduler, Sequence
from gateway.backends.learner import slo_limit
from gateway.backends.registry import BackendEntry, Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import BackendConfig, MonitorConfig, PolicyConfig, Settings, TierConfig
from gateway.core.exchange import Endpoint, Exchange
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.homes import Homes
from gateway.routing import PolicyParams, Reason, Role, Slo
from gateway.routing.affinity import affinity_key
from gateway.serve.assembly import core
from gateway.wire.metrics import EngineStats

__all__ = [
    "MODEL",
    "Done",
    "RunResult",
    "RunSpec",
    "SimEngine",
    "TracePoint",
    "client_view",
    "commit_step",
    "plan_steps",
    "simulate",
]

MODEL = "sim-model"
ENDPOINT = Endpoint("/v1/completions", chat=False)
# Where each learned curve is read back after a run (concurrency 1..64).
CURVE_LEVELS = tuple(range(1, 65))
# Concurrency at which the trace follows the latency tier's learned TPOT: the streams the
# latency tier holds under the traced load after the acceptance shift (the curve is judged
# where it has data).
TRACE_AT = 12

# Event kinds, in the order they are handled when they fall on the same instant: tokens first
# (a finished request frees its user), then arrivals, acceptance shifts, the monitor's round
# (it sees the step that just ended), and the phase change last (its users route on that scrape).
_STEP_END, _ARRIVE, _SHIFT, _SCRAPE, _PHASE = range(5)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run: a deployment, a load shape, an SLO class, a policy, a seed."""

    latency: tuple[str, ...]  # the latency tier's profiles, one engine each
    throughput: tuple[str, ...]  # the throughput pool's profiles
    users: tuple[int, ...]  # users per phase
    phase_s: float
    slo: Slo  # every request's
    policy: str
    params: PolicyParams = field(default_factory=PolicyParams)
    seed: int = 0
    # (virtual second, acceptance vector): the latency engines' workload changes then.
    shifts: tuple[tuple[float, tuple[float, ...]], ...] = ()
    prompt_tokens: int = 50  # a one-off prompt's; a conversation's question's
    output_tokens: int = 256
    scrape_interval_s: float = 0.25
    trace: bool = False  # record the latency tier's learned limit and routing share per scrape
    # Conversations: turns each (1: every request a prompt of its own), opening with a system
    # prompt of `system_tokens` every conversation shares.
    turns: int = 1
    system_tokens: int = 0

    @property
    def duration(self) -> float:
        return len(self.users) * self.phase_s


@dataclass(frozen=True, slots=True)
class Done:
    """One finished request, as the client saw it."""

    phase: int | None  # None: finished after the last phase (drained, not counted)
    at: float  # when it finished (virtual s)
    role: Role
    ttft: float
    tpot: float
    met: bool
    reason: str
    turn: int = 0  # of its conversation (0: the first, or a one-off prompt)
    stayed: bool = False  # a later turn served where its conversation's last turn was
    cached: int = 0  # prompt tokens the engine's prefix cache supplied


@dataclass(frozen=True, slots=True)
class TracePoint:
    """The latency tier at one monitor round."""

    t: float
    limit: int  # most streams the learned TPOT curve says meet the trace SLO
    tpot_at: float  # learned TPOT at TRACE_AT streams
    tokens_per_step: float
    routed: int  # requests routed since the last round
    routed_latency: int  # ... of them to the latency tier
    inflight: int  # the latency tier's in-flight count


@dataclass(slots=True)
class RunResult:
    spec: RunSpec
    done: list[Done]
    sent: int
    # Wall time of each policy call (ns) and the gateway's in-flight total when it was made.
    decision_ns: list[int]
    decision_inflight: list[int]
    reasons: dict[str, int]
    trace: list[TracePoint]
    # The learned TPOT curve per backend url at CURVE_LEVELS after the run, with the evidence
    # (decayed observations) behind each value (learned only).
    curves: dict[str, list[tuple[float, float]]]
    roles: dict[str, Role]
    profiles: dict[str, str]
    # Per phase, each backend's mean in-flight count (the lease integral over the phase).
    phase_load: list[dict[str, float]]
    ejections: int
    preemptions: int
    inflight_left: int
    wall_s: float


@dataclass(slots=True, eq=False)
class _Request:
    user: int
    ex: Exchange
    engine: SimEngine
    seq: Sequence
    turn: int = 0
    tokens: tuple[str, ...] = ()  # prompt + output, for the conversation's next turn


@dataclass(slots=True)
class _Conversation:
    """A user's conversation in progress: its key, the turn it is at, its history's tokens,
    and where its last turn was served."""

    key: int
    turn: int = 0
    history: tuple[str, ...] = ()
    last: str | None = None


@dataclass(slots=True, eq=False)
class SimEngine:
    """One simulated engine and what its metrics page says."""

    entry: BackendEntry
    profile: Profile
    sched: Scheduler
    stepping: bool = False
    # Gauges as published at the last plan (engines.sim.engine publishes them there).
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    # Counters, cumulative.
    itl_sum: float = 0.0
    itl_count: int = 0
    steps: int = 0  # the engine's steps (`vllm:iteration_tokens_total`'s count)
    generated: int = 0
    finished: int = 0
    # Of the sequences prefilled: their prompts whole, and the tokens of them found cached,
    # both counted once the step ends (as engines.sim.engine publishes them, and vLLM).
    prompt_tokens: int = 0
    prefix_hits: int = 0
    # Per sequence prefilled: the prefill-time histogram's sum and count (from its first
    # scheduling to its first token) and the prompt tokens it computed (vLLM's
    # `request_prefill_time_seconds`, `request_prefill_kv_computed_tokens`).
    prefill_sum: float = 0.0
    prefill_count: int = 0
    prefill_computed: int = 0

    def stats(self) -> dict[str, EngineStats]:
        """The engine's metrics page, parsed (what gateway.wire.metrics would return)."""
        spec = self.sched.spec if self.sched.lookahead else None
        return {MODEL: EngineStats(
            running=self.running, waiting=self.waiting, kv_usage=self.kv_usage,
            spec_drafts=None if spec is None else spec.drafts,
            spec_draft_tokens=None if spec is None else spec.draft_tokens,
            spec_accepted_tokens=None if spec is None else spec.accepted_tokens,
            success_total=self.finished, generation_tokens=self.generated,
            itl_sum=self.itl_sum, itl_count=self.itl_count,
            prompt_tokens=self.prompt_tokens, prefix_hit_tokens=self.prefix_hits,
            prefill_time_sum=self.prefill_sum, prefill_time_count=self.prefill_count,
            prefill_computed_sum=self.prefill_computed, steps=self.steps,
        )}  # fmt: skip


class _HasExchange(Protocol):
    ex: Exchange


R = TypeVar("R", bound=_HasExchange)


def commit_step(e: SimEngine, step: Any, now: float, requests: Mapping[Sequence, R]) -> list[R]:
    """A step of engine `e` ends at `now`: the engine's counters, and the timings of each
    request of `requests` it emitted for; returns those it finished, in the engine's order."""
    e.stepping = False
    e.steps += 1
    finished = []
    e.prompt_tokens += sum(seq.prompt_tokens for seq in step.prefills)
    e.prefix_hits = e.sched.prefix_hits
    before = {s: s.last_token_at for s in (*step.decodes, *step.prefills)}
    for em in e.sched.commit(step, now):
        seq = em.seq
        last = before.get(seq)
        if last is not None:  # vLLM's inter-token latency: one sample per later emission
            e.itl_sum += now - last
            e.itl_count += 1
        elif seq.first_scheduled is not None:  # its first token: its prefill done
            e.prefill_sum += now - seq.first_scheduled
            e.prefill_count += 1
            e.prefill_computed += seq.prompt_tokens - seq.cached_tokens
        e.generated += em.tokens
        req = requests.get(seq)
        if req is None:
            continue
        ex = req.ex
        if ex.first_text_at is None:
            ex.first_text_at = now
            ex.busy_mark = e.entry.busy_mark(now)  # the first byte (gateway.pipeline.upstream)
        ex.last_text_at = now
        ex.text_events += 1
        if em.finished:
            e.finished += 1
            finished.append(req)
    return finished


def plan_steps(dirty: set[SimEngine], now: float) -> list[tuple[SimEngine, Any]]:
    """Each engine of `dirty` not mid-step plans its next step at `now` and publishes its
    gauges (as engines.sim.engine does at a plan); returns the steps begun, to end after their
    duration. Empties `dirty`."""
    begun = []
    for e in sorted(dirty, key=lambda e: e.entry.url):
        if e.stepping:
            continue
        step = e.sched.plan(now)
        e.running, e.waiting = len(e.sched.running), len(e.sched.waiting)
        e.kv_usage = e.sched.kv_usage
        if step is not None:
            e.stepping = True
            begun.append((e, step))
    dirty.clear()
    return begun


def client_view(ex: Exchange) -> tuple[float, float, bool]:
    """A finished stream's TTFT and TPOT as its client measured them, and whether both met
    its SLO."""
    assert ex.first_text_at is not None
    assert ex.last_text_at is not None
    ttft = ex.first_text_at - ex.started
    tokens = ex.output_tokens or 0
    tpot = (ex.last_text_at - ex.first_text_at) / (tokens - 1) if tokens > 1 else 0.0
    return ttft, tpot, ttft <= ex.slo.ttft_s and tpot <= ex.slo.tpot_s


async def _discard(_message: Any) -> None:  # the client's ASGI send: nobody listens
    return None


class _Sim:
    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.now = 0.0
        self.events: list[tuple[float, int, int, Any]] = []
        self._n = 0
        urls = [
            (f"http://latency-{i}.sim", "latency", Role.LATENCY, p)
            for i, p in enumerate(spec.latency)
        ] + [
            (f"http://throughput-{i}.sim", "throughput", Role.THROUGHPUT, p)
            for i, p in enumerate(spec.throughput)
        ]
        tiers: dict[str, list[BackendConfig]] = {}
        for url, tier, _role, _p in urls:
            tiers.setdefault(tier, []).append(BackendConfig(url=url, models=[MODEL]))
        self.settings = Settings(
            tiers=[
                TierConfig.model_validate({"name": t, "role": t, "backends": b})
                for t, b in tiers.items()
            ],
            policy=PolicyConfig.model_validate(
                {**spec.params.model_dump(), "name": spec.policy, "seed": spec.seed}
            ),
            monitor=MonitorConfig(scrape_interval_s=spec.scrape_interval_s),
        )
        clock = self.clock
        telemetry = Telemetry()
        self.store = MemoryInflightStore()
        self.registry = Registry(self.settings, self.store, telemetry, clock)
        # Built as the gateway builds them (gateway.serve.assembly.core); no session:
        # Monitor.observe does no I/O, and the scrapes below are handed to it directly.
        self.learn = spec.policy == "learned"
        parts = core(self.settings, self.registry, None, self.learn)
        self.learner, self.monitor, self.router = parts.learner, parts.monitor, parts.router
        self.engines: list[SimEngine] = []
        for i, (url, _tier, _role, name) in enumerate(urls):
            profile = load_profile(name)
            sched = Scheduler(profile, random.Random(spec.seed * 7919 + i))
            self.engines.append(SimEngine(self.registry.entry(url), profile, sched))
        self.by_url = {e.entry.url: e for e in self.engines}
        self.requests: dict[Sequence, _Request] = {}
        self.busy_users: set[int] = set()
        self.sent_by_user: Counter[int] = Counter()
        self.wanted = 0
        self.done: list[Done] = []
        self.decision_ns: list[int] = []
        self.decision_inflight: list[int] = []
        self.reasons: Counter[str] = Counter()
        self.trace: list[TracePoint] = []
        self._routed = self._routed_latency = 0
        # Conversations (spec.turns > 1): each user's current one, and the gateway's memory of
        # where each key was served (as gateway.serve.assembly builds it).
        params = spec.params
        self.homes = Homes(params.affinity_keys, params.affinity_ttl_s, self.clock)
        self.talks: dict[int, _Conversation] = {}
        self.system = tuple(f"s{i}" for i in range(spec.system_tokens))
        self.dirty: set[SimEngine] = set()
        self.areas: list[dict[str, float]] = []  # lease integrals at each phase's start

    def clock(self) -> float:
        return self.now

    def push(self, at: float, kind: int, payload: Any = None) -> None:
        self._n += 1
        heapq.heappush(self.events, (at, kind, self._n, payload))

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> None:
        spec = self.spec
        for k in range(len(spec.users) + 1):  # the last "phase" (0 users) drains the run
            self.push(k * spec.phase_s, _PHASE, k)
        for at, vector in spec.shifts:
            self.push(at, _SHIFT, vector)
        self.push(0.0, _SCRAPE)
        events = self.events
        while events:
            at, kind, _n, payload = heapq.heappop(events)
            self.now = at
            if kind == _STEP_END:
                self.step_end(payload)
            elif kind == _ARRIVE:
                req: _Request = payload
                req.seq.arrival = at
                req.engine.sched.add(req.seq)
                self.dirty.add(req.engine)
            elif kind == _SHIFT:
                for e in self.engines[: len(spec.latency)]:
                    e.sched.acceptance = payload
            elif kind == _SCRAPE:
                self.scrape()
            else:
                self.phase(payload)
            if self.dirty and (not events or events[0][0] > at):
                self.kick()

    def kick(self) -> None:
        """Engines that are not mid-step plan their next one, once every event of this instant
        is in (so simultaneous arrivals join the same step)."""
        for e, step in plan_steps(self.dirty, self.now):
            self.push(self.now + step.duration, _STEP_END, (e, step))

    def phase(self, k: int) -> None:
        self.areas.append({e.entry.url: e.entry.busy_mark(self.now)[0] for e in self.engines})
        users = self.spec.users
        self.wanted = users[k] if k < len(users) else 0
        for u in range(self.wanted):
            if u not in self.busy_users:
                self.send(u)

    def step_end(self, payload: tuple[SimEngine, Any]) -> None:
        e, step = payload
        self.dirty.add(e)
        for req in commit_step(e, step, self.now, self.requests):
            self.finish(req)

    def finish(self, req: _Request) -> None:
        now, ex, entry = self.now, req.ex, req.engine.entry
        ex.output_tokens = req.seq.generated
        # The lease ends with the stream (gateway.backends.registry.Lease.__exit__), then the
        # learner reads the finished exchange, and the memory of homes (gateway.serve.app).
        self.store.release(entry.url)
        entry.count_lease(-1, ex.slo.tpot_s, now)
        if self.learn:
            self.learner.finished(ex)
        self.homes.end(ex)
        stayed = False
        talk = self.talks.get(req.user)
        if talk is not None:
            stayed = req.turn > 0 and talk.last == entry.url
            talk.last, talk.history = entry.url, req.tokens
            talk.turn += 1
            if talk.turn >= self.spec.turns:
                del self.talks[req.user]
        del self.requests[req.seq]
        ttft, tpot, met = client_view(ex)
        end = self.spec.duration
        phase = int(now // self.spec.phase_s) if now < end else None
        self.done.append(Done(phase, now, entry.backend.role, ttft, tpot, met, ex.decision.reason,
                              req.turn, stayed, req.seq.cached_tokens))  # fmt: skip
        self.busy_users.discard(req.user)
        if req.user < self.wanted:
            self.send(req.user)

    def send(self, user: int) -> None:
        """A user's next request: routed, leased, and on its way to the engine's front end."""
        now, spec = self.now, self.spec
        self.busy_users.add(user)
        self.sent_by_user[user] += 1
        n = self.sent_by_user[user]
        ex = Exchange(f"{user}-{n}", ENDPOINT, {}, _discard, now, model=MODEL, stream=True,
                      slo=spec.slo)  # fmt: skip
        turn, prompt, tokens = self.prompt(user, n, ex)
        # gateway.pipeline.router.Router.decide, with the policy call alone timed.
        router, registry = self.router, self.registry
        self.homes.begin(ex)
        req, snap = ex.route_request(), registry.snapshot()
        if req.home is not None:  # (the gateway estimates them from the body it relays)
            req = req._replace(prompt_tokens=prompt, max_tokens=spec.output_tokens)
        t0 = time.perf_counter_ns()
        decision = router.policy(req, snap, router.state, router.rng)
        self.decision_ns.append(time.perf_counter_ns() - t0)
        router.state = decision.state
        if router.affinity is not None and req.affinity is not None:
            decision = router.affinity(req, decision, snap)
        self.decision_inflight.append(sum(e.entry.busy for e in self.engines))
        ex.decision = decision
        self.reasons[decision.reason] += 1
        backend = decision.primary
        assert backend is not None, "every backend serves the model"
        engine = self.by_url[backend.url]
        entry = engine.entry
        # The lease (gateway.backends.registry.Lease.__enter__) and what gateway.pipeline.upstream
        # notes with it.
        self.store.acquire(entry.url)
        entry.count_lease(1, ex.slo.tpot_s, now)
        ex.joined_at_load = entry.busy
        ex.attempts, ex.backend, ex.status = 1, backend, 200
        self._routed += 1
        self._routed_latency += backend.role is Role.LATENCY
        seq = Sequence(ex.id, prompt, spec.output_tokens, now)
        if tokens:
            seq.block_hashes = block_hashes(tokens, engine.profile.block_size)
        r = _Request(user, ex, engine, seq, turn, tokens)
        self.requests[seq] = r
        delay = engine.profile.cost.frontend_delay_s(len(engine.sched.running))
        self.push(now + delay, _ARRIVE, r)

    def prompt(self, user: int, n: int, ex: Exchange) -> tuple[int, int, tuple[str, ...]]:
        """The user's next prompt: (its turn, its tokens, the tokens of prompt + answer for the
        prefix cache; none for a one-off prompt, which no cache holds). A conversation's turn
        carries its key, as the gateway's intake derives it."""
        spec = self.spec
        if spec.turns <= 1:
            return 0, spec.prompt_tokens, ()
        talk = self.talks.get(user)
        if talk is None:
            talk = self.talks[user] = _Conversation(affinity_key(f"{user}-{n}".encode()))
        ex.affinity = talk.key
        turn = talk.turn
        question = tuple(f"q{user}.{n}.{i}" for i in range(spec.prompt_tokens))
        answer = tuple(f"a{user}.{n}.{i}" for i in range(spec.output_tokens))
        prompt = (talk.history or self.system) + question
        return turn, len(prompt), prompt + answer

    def scrape(self) -> None:
        """One monitor round: every engine's page into the registry (and the learner), then
        the predictions refitted for routing."""
        now = self.now
        for e in self.engines:
            self.monitor.observe(e.entry, e.stats(), now)
        if self.learn:
            self.learner.refresh()
        if self.spec.trace:
            self.record()
        if now < self.spec.duration or self.requests:
            self.push(now + self.spec.scrape_interval_s, _SCRAPE)

    def record(self) -> None:
        lat = self.engines[0]
        pred = self.registry.curves[lat.entry.url]
        self.trace.append(TracePoint(
            self.now, slo_limit(pred, self.settings.slo.slo().tpot_s), pred.tpot.at(TRACE_AT),
            pred.tokens_per_step, self._routed, self._routed_latency, lat.entry.busy,
        ))  # fmt: skip
        self._routed = self._routed_latency = 0


def simulate(spec: RunSpec) -> RunResult:
    """Run one simulation to its end (every request finished)."""
    t0 = time.perf_counter()
    sim = _Sim(spec)
    sim.run()
    phase_s, areas = spec.phase_s, sim.areas
    phase_load = [{u: (b[u] - a[u]) / phase_s for u in a} for a, b in itertools.pairwise(areas)]
    curves: dict[str, list[tuple[float, float]]] = {}
    if sim.learn:
        for url, pred in sim.registry.curves.items():
            curves[url] = [(pred.tpot.at(n), pred.tpot.evidence_at(n)) for n in CURVE_LEVELS]
    return RunResult(
        spec=spec,
        done=sim.done,
        sent=sum(sim.sent_by_user.values()),
        decision_ns=sim.decision_ns,
        decision_inflight=sim.decision_inflight,
        reasons=dict(sim.reasons),
        trace=sim.trace,
        curves=curves,
        roles={e.entry.url: e.entry.backend.role for e in sim.engines},
        profiles={e.entry.url: e.profile.name for e in sim.engines},
        phase_load=phase_load,
        ejections=sum(e.entry.live.ejected for e in sim.engines),
        preemptions=sum(e.sched.preemptions for e in sim.engines),
        inflight_left=sum(e.entry.busy for e in sim.engines),
        wall_s=time.perf_counter() - t0,
    )


def saturated(result: RunResult) -> int:
    return result.reasons.get(Reason.SATURATED, 0)
