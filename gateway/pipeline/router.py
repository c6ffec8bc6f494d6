"""The routing policy applied to the live registry: snapshot -> policy -> prefix affinity
within the chosen tier (gateway.routing.affinity) -> decision.

The policy is pure (gateway.routing); this is the one place that gives it a snapshot, keeps
what it remembers between decisions (its `RouterState`) and owns its seeded random generator.
A policy that fails (a bug, an input it never met) must not turn requests into 500s: the
decision falls back to `least-loaded` with reason `policy_error`, and the log says so (the
first time, then every thousandth).
"""

from __future__ import annotations

import logging
import random

from gateway.backends.registry import Registry
from gateway.config.settings import PolicyConfig
from gateway.routing import Decision, Reason, RouteRequest, RouterState, build_policy
from gateway.routing.affinity import Affinity

__all__ = ["Router"]

log = logging.getLogger(__name__)


class Router:
    def __init__(self, cfg: PolicyConfig, registry: Registry) -> None:
        self.registry = registry
        self.policy = build_policy(cfg.name, cfg)
        self.fallback = build_policy("least-loaded", cfg)
        self.affinity = Affinity.of(cfg, registry.backends) if cfg.prefix_affinity else None
        self.rng = random.Random(cfg.seed)
        self.state = RouterState()
        self.failures = 0

    @property
    def name(self) -> str:
        return self.policy.name

    def decide(self, req: RouteRequest) -> Decision:
        snap = self.registry.snapshot()
        try:
            decision = self.policy(req, snap, self.state, self.rng)
        except Exception:
            self.failures += 1
            if self.failures % 1000 == 1:
                fields = {"policy": self.name, "times": self.failures}
                log.exception("routing policy failed: ordered by load", extra={"fields": fields})
            by_load = self.fallback(req, snap, self.state, self.rng)
            return Decision(by_load.candidates, Reason.POLICY_ERROR, self.name, self.state)
        self.state = decision.state
        # Affinity moves only a request with a home or a declared session (a first-seen
        # prompt keeps the policy's order: asked here, it costs no call).
        if self.affinity is not None and (req.home is not None or req.session):
            return self.affinity(req, decision, snap)
        return decision
