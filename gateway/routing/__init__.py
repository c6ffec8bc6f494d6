"""Pure routing: which backends, in what order, for one request given one load snapshot."""

from gateway.routing.policies import (
    DEFAULT_POLICY,
    POLICIES,
    Policy,
    get_policy,
    golden_range,
    latency_only,
    least_loaded,
    round_robin,
    throughput_only,
)
from gateway.routing.types import (
    Backend,
    BackendLoad,
    Decision,
    LoadSnapshot,
    PolicyParams,
    Reason,
    Role,
    RouteRequest,
    RouterState,
)

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Backend",
    "BackendLoad",
    "Decision",
    "LoadSnapshot",
    "Policy",
    "PolicyParams",
    "Reason",
    "Role",
    "RouteRequest",
    "RouterState",
    "get_policy",
    "golden_range",
    "latency_only",
    "least_loaded",
    "round_robin",
    "throughput_only",
]
