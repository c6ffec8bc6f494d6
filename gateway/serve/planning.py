"""The planner at work: the demand per SLO class counted from the gateway's own requests, the
learned curves of each tier's backends, and every `planner.interval_s` a plan of the replicas
each tier needs (gateway.planner), published on /metrics and in /state for an autoscaler.

What the plan rests on, and where it cannot see:
- a tier's capacity per replica is the median of its backends' (learned curves; a backend with
  none yet does not count). A tier with no learned curve at all is planned at no fewer replicas
  than it has in rotation now: nothing says it could do with fewer;
- the demand is this process's. Several gateway processes (workers, replicas) each count their
  own share and plan for it alone: their desired counts do not add up (each is rounded up, and
  held to the minimum), but the load each puts on a tier (replicas' worth, fractional) does, so
  an autoscaler in front of several follows the ceiling of its sum (docs/autoscaling.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gateway.backends.registry import Registry
from gateway.config.settings import PlannerConfig, TierConfig
from gateway.core.exchange import Exchange
from gateway.observe.telemetry import Telemetry
from gateway.planner import Plan, TierSupply, plan
from gateway.planner.demand import Demand
from gateway.routing.curves import Prediction

__all__ = ["Planning"]

log = logging.getLogger(__name__)


class Planning:
    def __init__(
        self,
        cfg: PlannerConfig,
        tiers: list[TierConfig],
        registry: Registry,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.registry, self.telemetry, self.clock = cfg, registry, telemetry, clock
        # Latency tiers first: the plan fills the earlier tiers with the classes they serve best
        # and gives the rest to the last (gateway.planner.replicas), a pool.
        self.tiers = sorted(tiers, key=lambda t: t.role != "latency")
        self.demand = Demand(cfg.tau_s, cfg.default_output_tokens, cfg.surge_s, cfg.headroom)
        self.last: Plan | None = None
        self._surging: set[str] = set()  # the classes read as surging at the last plan
        self.current: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    # -- fed by the request path -------------------------------------------------------------
    def arrived(self, ex: Exchange) -> None:
        self.demand.arrived(ex.slo, self.clock())

    def finished(self, ex: Exchange) -> None:
        if ex.backend is not None and ex.status < 400:
            self.demand.finished(ex.slo, ex.output_tokens or ex.text_events, self.clock())

    # -- one plan ----------------------------------------------------------------------------
    def supplies(self) -> list[TierSupply]:
        """Each tier as the planner sees it now: its learned curves, bounds and cost."""
        curves = self.registry.curves  # the learner's latest, as routing's snapshot takes them
        learned: dict[str, list[Prediction]] = {t.name: [] for t in self.tiers}
        current = dict.fromkeys(learned, 0)
        for e in self.registry:
            tier = e.backend.tier
            if tier not in current or e.left_at is not None:
                continue
            if not e.live.ejected:
                current[tier] += 1
            pred = curves.get(e.url)
            if pred is not None and pred.frontier:
                learned[tier].append(pred)
        self.current = current
        out = []
        for t in self.tiers:
            r = t.replicas
            # Nothing learned of the tier: no fewer than it has now.
            low = r.minimum if learned[t.name] else min(max(r.minimum, current[t.name]), r.maximum)
            out.append(TierSupply(t.name, tuple(learned[t.name]), None, low, r.maximum, r.cost))
        return out

    def step(self) -> Plan:
        """Plan now, publish the plan, and keep it for /state."""
        classes = self.demand.classes(self.clock())
        made = plan(self.supplies(), classes, self.cfg.params)
        self.last = made
        for c in classes:  # a surge's start is worth a line: the replicas asked for follow it
            if c.surge and c.name not in self._surging:
                log.info("demand surge in class %s: %.1f requests/s, rising %.2f/s; planned for "
                         "%.1f", c.name, c.rate, c.trend, made.demand.get(c.name, 0.0))  # fmt: skip
        self._surging = {c.name for c in classes if c.surge}
        t = self.telemetry
        for tier in made.tiers:
            t.desired_replicas.labels(tier.name).set(tier.desired)
            t.planned_load.labels(tier.name).set(tier.load)
            t.tier_replicas.labels(tier.name).set(self.current.get(tier.name, 0))
            for name, cap in tier.capacity.items():
                t.replica_capacity.labels(tier.name, name).set(cap)
        for name, rate in made.demand.items():
            t.demand.labels(name).set(rate)
            t.demand_unmet.labels(name).set(1 if name in made.unmet else 0)
        return made

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self.step()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="planner")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.interval_s)
            try:
                self.step()
            except Exception:  # the planner must outlive any one bad round
                log.exception("planner round failed")
