"""The scheduler in real time: one asyncio task steps it and hands tokens to the request streams.

Step ends are scheduled on absolute deadlines, so the few hundred microseconds of Python per step
do not add up: the engine only falls behind the profile when the CPU cannot keep up at all, and
then it carries on from "now" rather than bursting to catch up. `speedup` divides every modelled
duration (steps and front-end latency) so tests can run the same scheduler faster than real time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engines.front.metrics import EngineMetrics
from engines.sim.profile import Profile
from engines.sim.scheduler import Emission, Scheduler, Sequence, SpecCounters

# How far behind its schedule the loop may fall before it stops catching up (seconds).
MAX_LAG_S = 0.05


def engine_metrics(profile: Profile, model_name: str) -> EngineMetrics:
    """vLLM's metrics for an engine of this profile (KV-cache shape, speculative positions)."""
    spec = profile.speculative
    return EngineMetrics(
        model_name,
        block_size=profile.block_size,
        num_gpu_blocks=profile.num_gpu_blocks,
        speculative_tokens=spec.num_speculative_tokens if spec else None,
    )


@dataclass(slots=True, eq=False)
class Stream:
    """What one request sees: chunks of token counts, then None at the end."""

    seq: Sequence
    received: float
    queue: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    finish_reason: str | None = None
    last_at: float | None = None


class AsyncEngine:
    def __init__(
        self, profile: Profile, metrics: EngineMetrics, *, speedup: float = 1.0, seed: int = 0
    ) -> None:
        self.profile = profile
        self.metrics = metrics
        self.speedup = speedup
        self.sched = Scheduler(profile, random.Random(seed))
        self.in_frontend = 0
        self._streams: dict[Sequence, Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._frozen = False
        self._preemptions_seen = 0
        self._prefix_seen = (0, 0)  # the scheduler's prefix-cache counters already exported
        self._spec_seen = SpecCounters(accepted_per_pos=[0] * self.sched.lookahead)

    @property
    def load(self) -> int:
        return self.in_frontend + len(self.sched.running) + len(self.sched.waiting)

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def freeze(self) -> None:
        """Stop stepping for good (the 'hang' fault): streams stay open, nothing moves."""
        self._frozen = True

    async def generate(
        self, seq: Sequence, received: float, finish_reason: str = "length"
    ) -> AsyncIterator[int]:
        """Yield the number of new tokens of each engine step that advanced this request. `seq`
        is new; its arrival at the scheduler is set here, after the front end's delay."""
        self.in_frontend += 1
        try:
            await asyncio.sleep(
                self.profile.cost.frontend_delay_s(len(self.sched.running)) / self.speedup
            )
        finally:
            self.in_frontend -= 1
        seq.arrival = self.now()
        stream = Stream(seq, received, finish_reason=finish_reason)
        self._streams[seq] = stream
        self.sched.add(seq)
        self._wake.set()
        finished = False
        try:
            while (n := await stream.queue.get()) is not None:
                yield n
            finished = True
        finally:
            if not finished and self.sched.abort(seq):
                self.metrics.success["abort"].inc()
            self._streams.pop(seq, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if self._frozen or self.sched.idle:
                self._publish_gauges()
                self._wake.clear()
                await self._wake.wait()
                if self._frozen:
                    await asyncio.Event().wait()
                deadline = loop.time()
            start = loop.time()
            if start - deadline > MAX_LAG_S:
                deadline = start
            step = self.sched.plan(start)
            if step is None:
                # Only sequences that cannot be placed yet: wait for a change.
                self._publish_gauges()
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            self._publish_gauges()
            deadline += step.duration / self.speedup
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            end = loop.time()
            self.metrics.iteration_tokens.observe(step.tokens)
            self._deliver(self.sched.commit(step, end), step.prefills, end)
            self.metrics.preemptions.inc(self.sched.preemptions - self._preemptions_seen)
            self._preemptions_seen = self.sched.preemptions
            self._publish_prefix_cache()

    def _publish_prefix_cache(self) -> None:
        sched, (queries, hits) = self.sched, self._prefix_seen
        self.metrics.prefix_queries.inc(sched.prefix_queries - queries)
        self.metrics.prefix_hits.inc(sched.prefix_hits - hits)
        self._prefix_seen = (sched.prefix_queries, sched.prefix_hits)

    def _publish_gauges(self) -> None:
        m = self.metrics
        m.running.set(len(self.sched.running))
        m.waiting.set(len(self.sched.waiting))
        m.kv_usage.set(self.sched.kv_usage)

    def _deliver(self, emissions: list[Emission], prefilled: list[Sequence], now: float) -> None:
        m = self.metrics
        total = 0
        for em in emissions:
            stream = self._streams.get(em.seq)
            if stream is None:
                continue
            total += em.tokens
            if stream.last_at is None:
                m.ttft.observe(now - stream.received)
                seq = em.seq
                if seq.first_scheduled is not None:
                    m.queue.observe(seq.first_scheduled - seq.arrival)
                    m.prefill.observe(now - seq.first_scheduled)
                    m.prefill_computed.observe(seq.prompt_tokens - seq.cached_tokens)
            else:
                m.itl.observe(now - stream.last_at)
            stream.last_at = now
            stream.queue.put_nowait(em.tokens)
            if em.finished:
                self._finish(stream, now)
        m.generation_tokens.inc(total)
        for seq in prefilled:
            m.prompt_tokens.inc(seq.prompt_tokens)
        if m.spec is not None:
            drafts, draft_tokens, accepted, per_pos = m.spec
            c, seen = self.sched.spec, self._spec_seen
            drafts.inc(c.drafts - seen.drafts)
            draft_tokens.inc(c.draft_tokens - seen.draft_tokens)
            accepted.inc(c.accepted_tokens - seen.accepted_tokens)
            for pos, counter in enumerate(per_pos):
                counter.inc(c.accepted_per_pos[pos] - seen.accepted_per_pos[pos])
            self._spec_seen = SpecCounters(
                c.drafts, c.draft_tokens, c.accepted_tokens, list(c.accepted_per_pos)
            )

    def _finish(self, stream: Stream, now: float) -> None:
        m, seq = self.metrics, stream.seq
        e2e = now - stream.received
        m.e2e.observe(e2e)
        assert seq.first_token_at is not None
        if seq.generated > 1:
            m.tpot.observe((now - seq.first_token_at) / (seq.generated - 1))
        m.decode.observe(now - seq.first_token_at)
        m.success[stream.finish_reason or "length"].inc()
        stream.queue.put_nowait(None)
