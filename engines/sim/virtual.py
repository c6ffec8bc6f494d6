"""Run the scheduler on a virtual clock: a closed-loop benchmark in milliseconds of CPU time.

Used by the profile fitter and by unit tests. Clients behave like the calibration benchmark's:
`concurrency` users, each sending its next request as soon as the last one finished, their first
requests spread over one single-request latency so that arrivals are not in lockstep. Metrics use
the definitions of `vllm bench serve` (TTFT to the first token, TPOT over the remaining tokens,
throughput = tokens emitted inside a window in which every user is active).
"""

from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass

from engines.sim.profile import Profile
from engines.sim.scheduler import Scheduler, Sequence


@dataclass(frozen=True, slots=True)
class RequestRecord:
    sent: float
    ttft: float
    e2e: float
    tokens: int

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


@dataclass(frozen=True, slots=True)
class LoopResult:
    concurrency: int
    records: tuple[RequestRecord, ...]
    tok_s: float
    preemptions: int
    max_running: int
    max_waiting: int

    def median(self, what: str) -> float:
        values: list[float] = [v for r in self.records if (v := getattr(r, what)) is not None]
        return statistics.median(values)


def single_request_estimate(profile: Profile, prompt: int, output: int) -> float:
    c = profile.cost
    per_step = 1 + (profile.speculative.num_speculative_tokens if profile.speculative else 0)
    steps = output / (profile.speculative.mean_tokens_per_step() if profile.speculative else 1)
    return c.frontend_s + c.step_s(0, prompt) + steps * c.step_s(per_step, 0)


def closed_loop(
    profile: Profile,
    concurrency: int,
    *,
    prompt_tokens: int = 50,
    output_tokens: int = 256,
    requests_per_user: int = 4,
    seed: int = 0,
) -> LoopResult:
    sched = Scheduler(profile, random.Random(seed))
    stagger = single_request_estimate(profile, prompt_tokens, output_tokens) / concurrency
    # (time it reaches the scheduler, tie-breaker, user, time the client sent it)
    arrivals: list[tuple[float, int, int, float]] = []
    counter = 0
    sent_count = [0] * concurrency
    owner: dict[int, tuple[int, float]] = {}
    done: list[tuple[int, int, RequestRecord]] = []  # (user, n-th request, record)
    emitted: list[tuple[float, int]] = []
    max_running = max_waiting = 0

    def send(user: int, t: float) -> None:
        nonlocal counter
        delay = profile.cost.frontend_delay_s(len(sched.running))
        heapq.heappush(arrivals, (t + delay, counter, user, t))
        counter += 1
        sent_count[user] += 1

    for u in range(concurrency):
        send(u, u * stagger)
    now = 0.0
    while arrivals or not sched.idle:
        while arrivals and arrivals[0][0] <= now:
            t_arr, _, user, t_sent = heapq.heappop(arrivals)
            seq = Sequence(f"{user}-{sent_count[user]}", prompt_tokens, output_tokens, t_arr)
            owner[id(seq)] = (user, t_sent)
            sched.add(seq)
        step = sched.plan(now)
        if step is None:
            now = arrivals[0][0]
            continue
        max_running = max(max_running, len(sched.running))
        max_waiting = max(max_waiting, len(sched.waiting))
        now += step.duration
        for em in sched.commit(step, now):
            emitted.append((now, em.tokens))
            if not em.finished:
                continue
            user, t_sent = owner.pop(id(em.seq))
            assert em.seq.first_token_at is not None
            assert em.seq.last_token_at is not None
            rec = RequestRecord(
                sent=t_sent,
                ttft=em.seq.first_token_at - t_sent,
                e2e=em.seq.last_token_at - t_sent,
                tokens=em.seq.generated,
            )
            done.append((user, sent_count[user], rec))
            if sent_count[user] < requests_per_user:
                send(user, now)
    # Skip each user's first request (warm-up); throughput over the window where all are active.
    measured = tuple(r for _, n, r in done if n > 1)
    first_done = max(r.sent + r.e2e for _, n, r in done if n == 1)
    # Every user is active until its last request ends.
    last_end = [r.sent + r.e2e for _, n, r in done if n == requests_per_user]
    window_end = min(last_end) if last_end else now
    tokens = sum(n for t, n in emitted if first_done < t <= window_end)
    span = window_end - first_done
    tok_s = tokens / span if span > 0 else float("nan")
    return LoopResult(
        concurrency,
        measured or tuple(r for _, _, r in done),
        tok_s,
        sched.preemptions,
        max_running,
        max_waiting,
    )
