"""Kubernetes' HorizontalPodAutoscaler controller, on a virtual clock, for the autoscaling study:
the arms that scale by an HPA (the tutorial's thresholds, queue depth) must be scaled as a
cluster would scale them, not by a caricature.

As the controller does it (kube-controller-manager's podautoscaler, autoscaling/v2), every sync
period:
1. each metric proposes `ceil(current x value / target)` replicas, or `current` when the ratio is
   within the tolerance (0.1) of 1; the largest proposal wins;
2. stabilisation: the recommendation is held between the lowest proposal of the scale-up window
   and the highest of the scale-down window (defaults 0 s and 300 s), starting from `current`;
3. rate: a scale-up adds no more than its policies allow over their periods (default: the more
   of 100% and 4 pods per 15 s), a scale-down removes no more than its policies allow (default:
   100% per 15 s), counting the changes already made in each period; then min and max.

Simplified, and said so: a metric is one number per sync (the per-pod average or the external
value over the target); pods that have not started yet count in `current` but report nothing
(their metric is averaged over the ready ones), where the controller's treatment of missing
and unready pods for resource metrics is finer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["DEFAULT_DOWN", "DEFAULT_UP", "Hpa", "Policy", "Rules"]


@dataclass(frozen=True, slots=True)
class Policy:
    kind: Literal["Pods", "Percent"]
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class Rules:
    """One direction's behaviour (`spec.behavior.scaleUp` or `scaleDown`)."""

    stabilization_s: float
    policies: tuple[Policy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"


# Kubernetes' defaults when `behavior` leaves them out.
DEFAULT_UP = Rules(0.0, (Policy("Percent", 100, 15.0), Policy("Pods", 4, 15.0)))
DEFAULT_DOWN = Rules(300.0, (Policy("Percent", 100, 15.0),))


@dataclass
class Hpa:
    minimum: int
    maximum: int
    up: Rules = DEFAULT_UP
    down: Rules = DEFAULT_DOWN
    tolerance: float = 0.1
    # (when, the unstabilised proposal) of every sync, and (when, +/- replicas) of every change.
    _proposals: list[tuple[float, int]] = field(default_factory=list)
    _changes: list[tuple[float, int]] = field(default_factory=list)

    def propose(self, current: int, ratios: Sequence[float]) -> int:
        """Step 1: the replicas the metrics ask for (`ratios`: each metric's value over its
        target); `current` with no metric."""
        best = None
        for r in ratios:
            n = current if abs(r - 1.0) <= self.tolerance else math.ceil(r * current - 1e-9)
            best = n if best is None else max(best, n)
        return current if best is None else best

    def step(self, now: float, current: int, ratios: Sequence[float]) -> int:
        """One sync at `now`: the replicas the controller sets."""
        proposal = self.propose(current, ratios)
        stable = self._stabilize(now, current, proposal)
        new = self._limit(now, current, stable)
        if new != current:
            self._changes.append((now, new - current))
        return new

    def _stabilize(self, now: float, current: int, proposal: int) -> int:
        up_floor, down_ceiling = proposal, proposal
        for at, p in self._proposals:
            if at > now - self.up.stabilization_s:
                up_floor = min(up_floor, p)
            if at > now - self.down.stabilization_s:
                down_ceiling = max(down_ceiling, p)
        horizon = max(self.up.stabilization_s, self.down.stabilization_s)
        self._proposals = [(at, p) for at, p in self._proposals if at > now - horizon]
        self._proposals.append((now, proposal))
        return min(max(current, up_floor), down_ceiling)

    def _changed(self, now: float, period_s: float) -> tuple[int, int]:
        """(replicas added, replicas removed) in the `period_s` before `now`."""
        added = sum(d for at, d in self._changes if d > 0 and at > now - period_s)
        removed = -sum(d for at, d in self._changes if d < 0 and at > now - period_s)
        return added, removed

    def _limit(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            ceiling = min(self.maximum, max(current, self._rate_limit(now, current, up=True)))
            return min(desired, ceiling)
        if desired < current:
            floor = max(self.minimum, min(current, self._rate_limit(now, current, up=False)))
            return max(desired, floor)
        return min(max(desired, self.minimum), self.maximum)

    def _rate_limit(self, now: float, current: int, *, up: bool) -> int:
        """The most (`up`) or fewest replicas the direction's policies allow now, each counting
        from the replicas there were at the start of its period."""
        rules = self.up if up else self.down
        if rules.select == "Disabled":
            return current
        proposals = []
        for p in rules.policies:
            added, removed = self._changed(now, p.period_s)
            start = current - added + removed
            if p.kind == "Pods":
                proposals.append(start + p.value if up else start - p.value)
            elif up:  # rounded up, or a small percentage would never add a pod
                proposals.append(math.ceil(start * (1 + p.value / 100)))
            else:
                proposals.append(int(start * (1 - p.value / 100)))
        # "Max" selects the biggest change: the most replicas up, the fewest down.
        biggest = rules.select == "Max"
        return max(proposals) if biggest == up else min(proposals)
