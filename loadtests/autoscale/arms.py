"""The autoscalers the study compares, each as a cluster would run it: a Kubernetes HPA per tier
it scales (loadtests.autoscale.hpa), fed the metric its manifest names.

- `tutorial-hpa`: deploy/k8s/hpa.yaml, the tutorial's v5. The pool (2-10 replicas) on two
  per-pod metrics: finished requests per second (target 70% of the pool replica's measured
  ceiling) and the p99 end-to-end latency over a minute (target 60% of the SLA, taken as the
  time within which a request of the loosest class that meets its SLO has ended: its TTFT
  bound + its longest answer x its TPOT bound); scale-up 2 pods per minute, scale-down after
  90 s, 1 pod per minute. The latency tier stays as deployed.
- `queue-hpa`: the pool on `vllm:num_requests_waiting` per pod, target 5 (the queue-size signal
  GKE's inference autoscaling guide recommends starting from), with the same behaviour; the
  latency tier stays as deployed.
- `planner`: deploy/k8s/planner/hpa.yaml. Both tiers on `tiergate_tier_planned_load_replicas`
  (an External metric, AverageValue 1: the HPA asks for the planned load, rounded up);
  scale-up at once up to 11x per 15 s (the manifest's policy), scale-down after Kubernetes'
  default 300 s, 1 pod per minute.

Each reads what its metric would read at the sync (the metric pipeline's delay is left out for
all alike); pods that do not serve yet report nothing and are left out of a per-pod average.
"""

from __future__ import annotations

import math
from typing import Final

from loadtests.autoscale.cosim import TIERS, Elastic, Replica, Scaler
from loadtests.autoscale.hpa import Hpa, Policy, Rules
from loadtests.autoscale.traces import SPREAD

__all__ = ["ARMS", "Planner", "QueueHpa", "TutorialHpa"]

# deploy/k8s/hpa.yaml's behaviour.
TUTORIAL_UP: Final = Rules(0.0, (Policy("Pods", 2, 60.0),))
TUTORIAL_DOWN: Final = Rules(90.0, (Policy("Pods", 1, 60.0),))
# deploy/k8s/planner/hpa.yaml's (and keda.yaml's).
PLANNER_UP: Final = Rules(0.0, (Policy("Percent", 1000, 15.0),))
PLANNER_DOWN: Final = Rules(300.0, (Policy("Pods", 1, 60.0),))
CEILING_SHARE: Final = 0.7  # the tutorial: scale out at 70% of the measured ceiling
SLA_SHARE: Final = 0.6  # ... and at 60% of the SLA
QUEUE_TARGET: Final = 5.0
WINDOW_S: Final = 60.0  # the recording rules' rate window (deploy/prometheus/rules)


def _window(r: Replica, now: float) -> list[float]:
    """The end-to-end latencies of `r`'s requests finished within the last minute."""
    while r.done and r.done[0][0] < now - WINDOW_S:
        r.done.popleft()
    return [e2e for _, e2e in r.done]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class _PoolHpa(Scaler):
    """An HPA on the pool alone, on per-pod metrics; the latency tier as deployed."""

    def __init__(self, sim: Elastic) -> None:
        lo, hi = sim.spec.bounds[1]
        self.hpa = Hpa(lo, hi, TUTORIAL_UP, TUTORIAL_DOWN)
        self.latency = sim.spec.start[0]

    def ratios(self, pods: list[Replica], now: float) -> list[float]:
        """Each metric's per-pod average over its target, from the pods that serve."""
        raise NotImplementedError

    def desired(self, sim: Elastic, now: float) -> tuple[int, int]:
        mine = sim.tier_replicas("throughput")
        serving = [r for r in mine if r.ready]
        ratios = self.ratios(serving, now) if serving else []
        return self.latency, self.hpa.step(now, len(mine), ratios)


class TutorialHpa(_PoolHpa):
    def __init__(self, sim: Elastic) -> None:
        super().__init__(sim)
        spec = sim.spec
        self.rps_target = CEILING_SHARE * spec.ceiling
        sla = max(c.ttft_s + (1 + SPREAD) * c.output_tokens * c.tpot_s for c in spec.classes)
        self.p99_target = SLA_SHARE * sla

    def ratios(self, pods: list[Replica], now: float) -> list[float]:
        windows = [_window(r, now) for r in pods]
        rps = sum(len(w) for w in windows) / WINDOW_S / len(pods)
        p99s = [_p99(w) for w in windows if w]  # a pod with none: no series, not averaged
        out = [rps / self.rps_target]
        if p99s:
            out.append(sum(p99s) / len(p99s) / self.p99_target)
        return out


class QueueHpa(_PoolHpa):
    def ratios(self, pods: list[Replica], now: float) -> list[float]:
        waiting = [r.engine.waiting for r in pods if r.engine is not None]
        return [sum(waiting) / len(waiting) / QUEUE_TARGET]


class Planner(Scaler):
    """An HPA per tier on the planner's planned load for it."""

    def __init__(self, sim: Elastic) -> None:
        self.hpas = [Hpa(lo, hi, PLANNER_UP, PLANNER_DOWN) for lo, hi in sim.spec.bounds]

    def desired(self, sim: Elastic, now: float) -> tuple[int, int]:
        made = sim.planning.last
        load = {t.name: t.load for t in made.tiers} if made is not None else {}
        out = []
        for tier, hpa in zip(TIERS, self.hpas, strict=True):
            current = len(sim.tier_replicas(tier))
            ratios = [load[tier] / current] if tier in load and current else []
            out.append(hpa.step(now, current, ratios))
        return out[0], out[1]


ARMS: Final = {"tutorial-hpa": TutorialHpa, "queue-hpa": QueueHpa, "planner": Planner}
