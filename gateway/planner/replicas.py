"""How many replicas of each tier: the counts that serve every SLO class's forecast demand within
its SLO at the least cost.

Each class's demand is measured in requests per second; a tier's replica serves `capacity` of a
class's requests per second within that class's SLO (gateway.planner.capacity), so a share x of
the class's demand on that tier takes x / capacity replicas, and the classes a replica serves add
up (its time is shared). The counts of every tier but the last are enumerated between their
minimum and maximum; for each, those tiers take the classes they serve best against the last tier
(the highest ratio of their capacity to the last tier's first, up to their replicas), and the
last tier takes the rest. With one tier before the last (a latency tier before the pool) this
greedy fill is the optimum of the fractional assignment, so the search is exact for the counts;
with more it is a good order, not a proof. The cheapest plan wins; on a tie, the fewest replicas,
then the fewest of the earlier tiers.

A class no tier serves within its SLO is reported unmet, and still planned for: its requests
are answered as well as can be, beside the loosest class served, so they are counted at that
class's SLO (`_best_effort`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gateway.planner.capacity import tier_capacity
from gateway.planner.forecast import forecast
from gateway.routing.curves import Prediction
from gateway.routing.types import Slo

__all__ = ["ClassDemand", "Plan", "PlanParams", "TierPlan", "TierSupply", "plan"]

# A count of replicas a hair above an integer (float sums) is that integer.
_EPS = 1e-9
# The most combinations of the earlier tiers' counts tried one by one; past it (many tiers),
# a coordinate descent (_descend). A latency tier before a pool is 1..10 or so.
_EXHAUSTIVE = 4096

# (the sort key: cost, replicas, the earlier tiers' counts), each tier's load, the last's count.
_Candidate = tuple[tuple[float, int, tuple[int, ...]], list[float], int]


@dataclass(frozen=True, slots=True)
class ClassDemand:
    """One SLO class's demand lately: requests per second, their trend (requests/s per second)
    and their mean answer length in tokens; `surge`: read from a rise beyond the noise
    (gateway.planner.demand)."""

    name: str
    slo: Slo
    rate: float
    output_tokens: float
    trend: float = 0.0
    surge: bool = False


@dataclass(frozen=True, slots=True)
class TierSupply:
    """One tier: its replicas' learned curves (those with data), the curves to assume where it
    has none (a cold start, or no replica yet: from the engine's profile or the configured
    limits), its bounds and its cost per replica (GPUs, by default one)."""

    name: str
    curves: tuple[Prediction, ...] = ()
    prior: Prediction | None = None
    minimum: int = 1
    maximum: int = 10
    cost: float = 1.0
    max_streams: int = 256  # the engine's batch limit (vLLM's --max-num-seqs)


@dataclass(frozen=True, slots=True)
class PlanParams:
    # Spare capacity over the forecast, for the forecast's error.
    headroom: float = 0.2
    # How long a replica takes from being asked for to serving: the trend is carried over it.
    startup_s: float = 60.0
    # The share of a class's streams planned to meet its TPOT SLO.
    attainment: float = 0.9
    # A surging class's forecast times this (gateway.planner.forecast).
    surge_factor: float = 2.0


@dataclass(frozen=True, slots=True)
class TierPlan:
    name: str
    desired: int
    # Replicas' worth of the forecast demand planned onto the tier (desired >= this).
    load: float
    # Per class: requests/s one replica serves within the class's SLO (0: not at all).
    capacity: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Plan:
    tiers: tuple[TierPlan, ...]
    cost: float
    # Per class: the forecast demand planned for (requests/s).
    demand: Mapping[str, float]
    # Classes with demand that no tier serves within their SLO even at its maximum.
    unmet: tuple[str, ...] = ()


def plan(tiers: Sequence[TierSupply], classes: Sequence[ClassDemand], params: PlanParams) -> Plan:
    """The replicas each tier needs for `classes`' demand (see the module's docstring)."""
    if not tiers:
        raise ValueError("nothing to plan: no tier")
    demand = {c.name: forecast(c.rate, c.trend, params.startup_s, params.headroom,
                               params.surge_factor if c.surge else 1.0)
              for c in classes}  # fmt: skip
    caps = [_capacities(t, classes, params) for t in tiers]
    served = {c.name for c in classes if any(cap[c.name] > 0 for cap in caps)}
    unmet = tuple(sorted(n for n, d in demand.items() if d > 0 and n not in served))
    for cap, extra in zip(caps, _best_effort(tiers, classes, served, params), strict=True):
        cap.update(extra)
    want = {name: d for name, d in demand.items()
            if d > 0 and any(cap[name] > 0 for cap in caps)}  # fmt: skip

    *first, last = tiers

    def evaluate(counts: tuple[int, ...]) -> _Candidate | None:
        loads, rest = _fill(counts, caps[:-1], caps[-1], want)
        need, unserved = _left_for_last(rest, caps[-1])
        n_last = max(last.minimum, math.ceil(need - _EPS))
        if unserved or n_last > last.maximum:
            return None
        cost = sum(n * t.cost for n, t in zip(counts, first, strict=True)) + n_last * last.cost
        return (cost, sum(counts) + n_last, counts), [*loads, need], n_last

    ranges = [range(t.minimum, t.maximum + 1) for t in first]
    if math.prod(len(r) for r in ranges) <= _EXHAUSTIVE:
        found = (evaluate(c) for c in itertools.product(*ranges))
        best = min((c for c in found if c is not None), key=lambda c: c[0], default=None)
    else:
        best = _descend(ranges, evaluate)
    if best is None:
        # Not even every tier at its maximum serves it all: plan the maximum, say what is short:
        # a class the last tier does not serve, or, past its maximum, every class left to it
        # (each gets a share of too few replicas).
        counts = tuple(t.maximum for t in first)
        loads, rest = _fill(counts, caps[:-1], caps[-1], want)
        need, short = _left_for_last(rest, caps[-1])
        if need > last.maximum + _EPS:
            short |= {n for n, left in rest.items() if left > _EPS}
        unmet = tuple(sorted({*unmet, *short}))
        best = ((0.0, 0, counts), [*loads, need], last.maximum)
    (_, _, counts), loads, n_last = best
    desired = (*counts, n_last)
    out = tuple(TierPlan(t.name, n, load, MappingProxyType(cap))
                for t, n, load, cap in zip(tiers, desired, loads, caps, strict=True))  # fmt: skip
    cost = sum(n * t.cost for n, t in zip(desired, tiers, strict=True))
    return Plan(out, cost, MappingProxyType(demand), unmet)


def _descend(
    ranges: Sequence[range], evaluate: Callable[[tuple[int, ...]], _Candidate | None]
) -> _Candidate | None:
    """The best counts found by coordinate descent from every earlier tier at its maximum
    (feasible if anything is): each tier's count in turn tried over its range with the others
    held, until a whole pass improves nothing. A local optimum, not a proof, for deployments
    of many tiers; the usual two are searched exhaustively."""
    counts = [r[-1] for r in ranges]
    best = evaluate(tuple(counts))
    if best is None:
        return None
    improved = True
    while improved:
        improved = False
        for i, r in enumerate(ranges):
            for n in r:
                trial = evaluate((*counts[:i], n, *counts[i + 1 :]))
                if trial is not None and trial[0] < best[0]:
                    best, counts[i], improved = trial, n, True
    return best


def _capacities(
    tier: TierSupply, classes: Sequence[ClassDemand], params: PlanParams
) -> dict[str, float]:
    preds = tier.curves or ((tier.prior,) if tier.prior is not None else ())
    return {c.name: tier_capacity(preds, c.slo, c.output_tokens, params.attainment,
                                  tier.max_streams) for c in classes}  # fmt: skip


def _best_effort(
    tiers: Sequence[TierSupply], classes: Sequence[ClassDemand], served: set[str],
    params: PlanParams,
) -> list[dict[str, float]]:  # fmt: skip
    """Per tier, the capacity for each class no tier serves within its SLO, read at the SLO of
    the loosest class served: such requests are still answered as well as can be, their
    streams beside those of the classes served, which must keep their SLOs with them there (a
    plan that left them out counted on slots they take)."""
    out: list[dict[str, float]] = [{} for _ in tiers]
    loose = max((c.slo for c in classes if c.name in served),
                key=lambda slo: (slo.tpot_s, slo.ttft_s), default=None)  # fmt: skip
    if loose is None:
        return out
    stand_ins = [replace(c, slo=loose) for c in classes if c.name not in served]
    for tier, extra in zip(tiers, out, strict=True):
        extra.update(_capacities(tier, stand_ins, params))
    return out


def _left_for_last(rest: Mapping[str, float], cap: Mapping[str, float]) -> tuple[float, set[str]]:
    """Replicas' worth of the demand `rest` on the last tier, and the classes it does not serve."""
    need, unserved = 0.0, set()
    for name, left in rest.items():
        if left > _EPS:
            if cap[name] > 0:
                need += left / cap[name]
            else:
                unserved.add(name)
    return need, unserved


def _fill(
    counts: Sequence[int], caps: Sequence[Mapping[str, float]], last: Mapping[str, float],
    want: Mapping[str, float],
) -> tuple[list[float], dict[str, float]]:  # fmt: skip
    """The earlier tiers, `counts` replicas each, take the classes they serve best against the
    last tier; returns each one's load (replicas' worth) and the demand left for the last."""
    rest = dict(want)
    loads = []
    for n, cap in zip(counts, caps, strict=True):
        budget = float(n)
        order = sorted((name for name in rest if cap[name] > 0),
                       key=lambda name: cap[name] / last[name] if last[name] > 0 else math.inf,
                       reverse=True)  # fmt: skip
        for name in order:
            if budget <= _EPS:
                break
            take = min(rest[name], budget * cap[name])
            rest[name] -= take
            budget -= take / cap[name]
        loads.append(n - budget)
    return loads, rest
