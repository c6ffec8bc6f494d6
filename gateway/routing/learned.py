"""``learned``: each request where it is predicted to meet its SLO, from each backend's learned
latency curves (gateway.latency_model), with no hand-set golden range.

Per candidate backend at concurrency n, the prediction for n + 1 streams:
- it *meets* the request's SLO when predicted TPOT and TTFT are within it, less `slo_margin`
  for the model's error (the SLO is a cliff, the curve a mean);
- it *hurts* the streams already there that n + 1 would push past their own TPOT SLO (one more
  stream slows every stream of a batch, a speculative one most);
- its *gain* is the change in the backend's SLO-meeting output (tokens per second of the
  streams that meet their SLO, the request included): negative past the backend's knee, where
  one more stream slows the others by more than it adds;
- it is *full* when its predicted TTFT is beyond `full_ttft_factor` times the request's TTFT
  SLO, or (as for every policy) a fresh scrape shows a long queue: admission then holds the
  request, and answers 429 if nothing frees.

Order: first the backends that meet the SLO and hurt no one: those still before their knee
first, then the fastest (TPOTs within 5% of one another count as equal: the model's noise),
then the least loaded; then the other backends with room, by most gain; full ones last, by
least excess. So the latency tier fills to its knee while the
throughput tier can meet the SLO too, and past it only for requests nothing else can serve in
time: wherever the hardware and the acceptance put the crossover. With probability
`explore_rate` a backend whose model has had no observation for `explore_after_s` goes first,
so a tier that lost its traffic (EAGLE accepting little) is noticed when it recovers.

A pure function of (request, snapshot with its predictions, state, rng).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gateway.routing.curves import Prediction
from gateway.routing.filters import eligible, pinned
from gateway.routing.params import PolicyParams
from gateway.routing.types import (
    Backend,
    BackendLoad,
    Decision,
    LoadSnapshot,
    Reason,
    Role,
    RouteRequest,
    RouterState,
    Slo,
)

__all__ = ["Learned", "Outlook", "outlook", "speed_bands"]

# Predicted TPOTs within this ratio of their band's fastest rank alike (then by load): the noise.
_ALIKE = 1.05
_FLOOR = 1e-6


class Outlook(NamedTuple):
    """What one more request would see on a backend, and what it would do there. (A named
    tuple: one is built per candidate per decision, and a frozen dataclass costs twice as much
    to build.)"""

    tpot: float  # predicted, with the request
    ttft: float
    meets: bool  # the request would meet its SLO there
    hurt: int  # streams there it would push past their SLO
    gain: float  # SLO-meeting tokens per second the backend would gain (negative: lose)
    full: bool
    load: int

    @property
    def clean(self) -> bool:
        """Meets the request's SLO and pushes no one past theirs."""
        return self.meets and not self.hurt

    def key(self, slo: Slo, speed: int) -> tuple[int, bool, float, float]:
        """Sort key; `speed`: the rank of this backend's band of alike TPOTs (clean ones)."""
        if self.full:
            return 2, False, max(self.tpot / slo.tpot_s, self.ttft / slo.ttft_s), 0.0
        if self.clean:
            return 0, self.gain < 0, speed, self.load
        return 1, False, -self.gain, 0.0


def speed_bands(tpots: Sequence[float]) -> list[int]:
    """Each TPOT's band: sorted, a new band starts past 5% above the first of the last band,
    so backends the model can barely tell apart go by load, not by noise."""
    bands = [0] * len(tpots)
    band, start = -1, 0.0
    for t, i in sorted(zip(tpots, range(len(tpots)), strict=True)):
        if band < 0 or t > start * _ALIKE:
            band, start = band + 1, t
        bands[i] = band
    return bands


def outlook(
    b: Backend, load: BackendLoad, pred: Prediction | None, slo: Slo, params: _Limits
) -> Outlook:
    n = load.effective
    if pred is None:  # not modelled (yet): usable, ranked after every modelled backend with room
        return Outlook(math.inf, math.inf, False, 0, -math.inf, False, n)
    tpots, ttfts = pred.tpot.table, pred.ttft.table
    if n + 1 < len(tpots):  # the common case, read from the tables directly
        now, tpot, ttft = tpots[n], tpots[n + 1], ttfts[n + 1]
    else:
        now, tpot, ttft = pred.tpot.at(n), pred.tpot.at(n + 1), pred.ttft.at(n + 1)
    # A microsecond at least: an engine that streams a whole answer at once has a TPOT of 0.
    now, tpot = max(now, _FLOOR), max(tpot, _FLOOR)
    room = 1.0 - params.slo_margin
    tpot_slo = slo.tpot_s * room
    meets = tpot <= tpot_slo and ttft <= slo.ttft_s * room
    # Streams there whose SLO this gateway does not know (another replica's) are taken to
    # share the request's. One pass: the streams it would push past their SLO, and those
    # meeting theirs before and after.
    hurt = known = met_now = met_then = 0
    for s, count in load.slos:
        known += count
        if now <= s:
            met_now += count
        if tpot <= s:
            met_then += count
        if now <= s * room < tpot:
            hurt += count
    others = n - known
    if others > 0:
        if now <= tpot_slo < tpot:
            hurt += others
        if now <= slo.tpot_s:
            met_now += others
        if tpot <= slo.tpot_s:
            met_then += others
    # The gain counts every stream, the request too, by the curve's mean against its SLO: the
    # margin is for calling a backend safe; once none is, the expected count is what matters,
    # and a stream whose SLO sits at the curve's mean meets it one time in two.
    if tpot <= slo.tpot_s and ttft <= slo.ttft_s:
        met_then += 1
    gain = met_then / tpot - met_now / now
    full = ttft > params.full_ttft_factor * slo.ttft_s or (
        b.role is Role.THROUGHPUT and not load.stale and load.waiting > params.max_waiting
    )
    return Outlook(tpot, ttft, meets, hurt, gain, full, n)


@dataclass(frozen=True, slots=True)
class _Limits:
    slo_margin: float
    full_ttft_factor: float
    max_waiting: int
    explore_rate: float
    explore_after_s: float


@dataclass(frozen=True, slots=True)
class Learned:
    name: str
    limits: _Limits

    @classmethod
    def build(cls, name: str, params: PolicyParams) -> Learned:
        return cls(name, _Limits(params.slo_margin, params.full_ttft_factor, params.max_waiting,
                                 params.explore_rate, params.explore_after_s))  # fmt: skip

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        pool = pinned(req, eligible(req, snap))
        if not pool:
            return Decision((), Reason.NO_BACKEND, self.name, state)
        slo, curves, load, limits = req.slo, snap.curves, snap.load, self.limits
        outlooks = [outlook(b, load(b.url), curves.get(b.url), slo, limits) for b in pool]
        bands = speed_bands([o.tpot for o in outlooks])
        # (key, random tie-break, position): plain tuples sort fastest
        keys = [(o.key(slo, bands[i]), rng.random(), i) for i, o in enumerate(outlooks)]
        keys.sort()
        ordered = [pool[k[2]] for k in keys]
        first = outlooks[keys[0][2]]
        if first.full:
            reason: str = Reason.SATURATED
        elif req.pinned is not None:
            reason = Reason.PINNED
        elif first.clean:
            reason = Reason.PREDICTED_SLO_MET
        else:
            reason = Reason.HEADROOM
        # One draw per decision whatever happens, so a seed replays the whole sequence.
        if rng.random() < limits.explore_rate and reason != Reason.SATURATED:
            for k in keys[1:]:
                b, o = pool[k[2]], outlooks[k[2]]
                if o.full:
                    continue
                pred = curves.get(b.url)
                seen = None if pred is None else pred.observed_at
                if seen is None or snap.taken_at - seen > limits.explore_after_s:
                    ordered.remove(b)
                    ordered.insert(0, b)
                    reason = Reason.EXPLORE
                    break
        return Decision(tuple(ordered), reason, self.name, state)
