"""Pure routing: which backends, in what order, for one request given one load snapshot.

Stages, each pure and tested on its own: ``filters`` (who may take the request), ``saturation``
(who has room), ``order`` (in what order); the policies built from them: ``golden``,
``baselines`` and ``learned`` (which reads the latency model's predictions, ``curves``);
``policies`` (the catalog), ``params`` (the names and parameters, defined once).
"""

from gateway.routing.params import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    ParamError,
    PolicyName,
    PolicyParams,
)
from gateway.routing.policies import POLICIES, Policy, build_policy
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

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "POLICY_NAMES",
    "Backend",
    "BackendLoad",
    "Decision",
    "LoadSnapshot",
    "ParamError",
    "Policy",
    "PolicyName",
    "PolicyParams",
    "Reason",
    "Role",
    "RouteRequest",
    "RouterState",
    "Slo",
    "build_policy",
]
