"""Pure planning: how many replicas of each tier the demand needs, from the learned curves.

Stages, each pure and tested on its own: ``forecast`` (the demand a new replica will meet once it
has started), ``capacity`` (the requests per second one replica serves within an SLO class, read
from its latency curves), ``replicas`` (the counts per tier that serve every class at the least
cost). Nothing here reads a clock, a socket or a metric: the caller gathers the inputs.
"""

from gateway.planner.capacity import capacity, tier_capacity
from gateway.planner.forecast import forecast
from gateway.planner.replicas import ClassDemand, Plan, PlanParams, TierPlan, TierSupply, plan

__all__ = [
    "ClassDemand",
    "Plan",
    "PlanParams",
    "TierPlan",
    "TierSupply",
    "capacity",
    "forecast",
    "plan",
    "tier_capacity",
]
