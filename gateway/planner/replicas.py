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
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.planner.capacity import tier_capacity
from gateway.planner.forecast import forecast
from gateway.routing.curves import Prediction
from gateway.routing.types import Slo

__all__ = ["ClassDemand", "Plan", "PlanParams", "TierPlan", "TierSupply", "plan"]

# A count of replicas a hair above an integer (float sums) is that integer.
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ClassDemand:
    """One SLO class's demand lately: requests per second, their trend (requests/s per second)
    and their mean answer length in tokens."""

    name: str
    slo: Slo
    rate: float
    output_tokens: float
    trend: float = 0.0


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
    demand = {c.name: forecast(c.rate, c.trend, params.startup_s, params.headroom)
              for c in classes}  # fmt: skip
    caps = [_capacities(t, classes, params) for t in tiers]
    served = {c.name for c in classes if any(cap[c.name] > 0 for cap in caps)}
    want = {name: d for name, d in demand.items() if d > 0 and name in served}
    unmet = tuple(sorted(n for n, d in demand.items() if d > 0 and n not in served))

    *first, last = tiers
    best: tuple[tuple[float, int, tuple[int, ...]], list[float], int] | None = None
    for counts in itertools.product(*(range(t.minimum, t.maximum + 1) for t in first)):
        loads, rest = _fill(counts, caps[:-1], caps[-1], want)
        need, unserved = _left_for_last(rest, caps[-1])
        n_last = max(last.minimum, math.ceil(need - _EPS))
        if unserved or n_last > last.maximum:
            continue
        cost = sum(n * t.cost for n, t in zip(counts, first, strict=True)) + n_last * last.cost
        key = (cost, sum(counts) + n_last, counts)
        if best is None or key < best[0]:
            best = (key, [*loads, need], n_last)
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


def _capacities(
    tier: TierSupply, classes: Sequence[ClassDemand], params: PlanParams
) -> dict[str, float]:
    preds = tier.curves or ((tier.prior,) if tier.prior is not None else ())
    return {c.name: tier_capacity(preds, c.slo, c.output_tokens, params.attainment,
                                  tier.max_streams) for c in classes}  # fmt: skip


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
