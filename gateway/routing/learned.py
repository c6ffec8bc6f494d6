"""``learned``: each request where it is predicted to meet its SLO, from each backend's learned
latency curves (gateway.latency_model), with no hand-set golden range.

Per candidate backend at concurrency n, the prediction for n + 1 streams:
- it *meets* the request's SLO when predicted TPOT and TTFT are within it;
- it *harms* the streams already there when n + 1 pushes some of them past their own TPOT SLO
  (one more stream slows every stream of a batch, most of all on a speculative one);
- it is *full* when its predicted TTFT is beyond `full_ttft_factor` times the request's TTFT
  SLO, or (as for every policy) a fresh scrape shows a long queue: admission then holds the
  request, and answers 429 if nothing frees.

Order: backends that meet the SLO without harm, fastest predicted TPOT first (which finds the
tiers' crossover by itself, wherever the hardware and the acceptance put it); then those with
room, by least harm and then most headroom; full ones last. With probability `explore_rate` a
backend whose model has had no observation for `explore_after_s` goes first, so a tier that
lost all its traffic (EAGLE accepting little) is noticed when it recovers.

A pure function of (request, snapshot with its predictions, state, rng).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

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

__all__ = ["Learned", "Outlook", "harm", "outlook"]


def harm(slos: Sequence[tuple[float, int]], before: float, after: float) -> int:
    """Streams whose TPOT SLO holds at `before` but not at `after`."""
    n = 0
    for slo, count in slos:
        if before <= slo < after:
            n += count
    return n


@dataclass(frozen=True, slots=True)
class Outlook:
    """What one more request would see on a backend, and do to it."""

    tpot: float  # predicted, with the request
    ttft: float
    meets: bool
    harm: int
    full: bool

    def key(self, slo: Slo) -> tuple[int, int, float]:
        """Sort key: group (0 meets without harm, 1 room, 2 full), harm, then speed or headroom
        (relative, so TTFT and TPOT weigh alike)."""
        if self.full:
            return 2, 0, self.excess(slo)
        if self.meets and not self.harm:
            return 0, 0, self.tpot
        return 1, self.harm, self.excess(slo)

    def excess(self, slo: Slo) -> float:
        return max(self.tpot / slo.tpot_s, self.ttft / slo.ttft_s)


def outlook(
    b: Backend, load: BackendLoad, pred: Prediction | None, slo: Slo, params: _Limits
) -> Outlook:
    n = load.effective
    if pred is None:  # not modelled (yet): usable, ranked after every modelled backend with room
        return Outlook(math.inf, math.inf, False, 0, False)
    tpot, ttft = pred.tpot.at(n + 1), pred.ttft.at(n + 1)
    meets = tpot <= slo.tpot_s and ttft <= slo.ttft_s
    hurt = harm(load.slos, pred.tpot.at(n), tpot) if load.slos else 0
    full = ttft > params.full_ttft_factor * slo.ttft_s or (
        b.role is Role.THROUGHPUT and not load.stale and load.waiting > params.max_waiting
    )
    return Outlook(tpot, ttft, meets, hurt, full)


@dataclass(frozen=True, slots=True)
class _Limits:
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
        return cls(name, _Limits(params.full_ttft_factor, params.max_waiting,
                                 params.explore_rate, params.explore_after_s))  # fmt: skip

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        pool = pinned(req, eligible(req, snap))
        if not pool:
            return Decision((), Reason.NO_BACKEND, self.name, state)
        slo, curves, load, limits = req.slo, snap.curves, snap.load, self.limits
        scored = []
        for b in pool:
            pred = curves.get(b.url)
            o = outlook(b, load(b.url), pred, slo, limits)
            scored.append((o.key(slo), rng.random(), b, o, pred))
        scored.sort(key=lambda s: (s[0], s[1]))
        ordered = [s[2] for s in scored]
        first = scored[0][3]
        if first.full:
            reason: str = Reason.SATURATED
        elif req.pinned is not None:
            reason = Reason.PINNED
        elif first.meets and not first.harm:
            reason = Reason.PREDICTED_SLO_MET
        else:
            reason = Reason.HEADROOM
        # One draw per decision whatever happens, so a seed replays the whole sequence.
        if rng.random() < limits.explore_rate and reason != Reason.SATURATED:
            for _key, _draw, b, o, pred in scored:
                if o.full or b is ordered[0]:
                    continue
                seen = None if pred is None else pred.observed_at
                if seen is None or snap.taken_at - seen > limits.explore_after_s:
                    ordered.remove(b)
                    ordered.insert(0, b)
                    reason = Reason.EXPLORE
                    break
        return Decision(tuple(ordered), reason, self.name, state)
