"""The routing policy applied to the live registry: snapshot -> policy -> decision.

The policy is pure (gateway.routing); this is the one place that gives it a snapshot, keeps
what it remembers between decisions (its `RouterState`) and owns its seeded random generator.
"""

from __future__ import annotations

import random

from gateway.registry import Registry
from gateway.routing import Decision, RouteRequest, RouterState, build_policy
from gateway.settings import PolicyConfig

__all__ = ["Router"]


class Router:
    def __init__(self, cfg: PolicyConfig, registry: Registry) -> None:
        self.registry = registry
        self.policy = build_policy(cfg.name, cfg)
        self.rng = random.Random(cfg.seed)
        self.state = RouterState()

    @property
    def name(self) -> str:
        return self.policy.name

    def decide(self, req: RouteRequest) -> Decision:
        decision = self.policy(req, self.registry.snapshot(), self.state, self.rng)
        self.state = decision.state
        return decision
