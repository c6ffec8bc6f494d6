"""Pure routing: which backends, in what order, for one request given one load snapshot.

Stages, each pure and tested on its own: ``filters`` (who may take the request), ``saturation``
(who has room), ``order`` (in what order); the policies built from them: ``golden``,
``baselines`` and ``learned`` (which reads the latency model's predictions, ``curves``);
``policies`` (the catalog), ``params`` (the names and parameters, defined once).

The modules on a decision's path come from their compiled build where one matches these sources
(``native``): it is searched first.
"""

import os
from pathlib import Path

from gateway.routing.native import build_path

__path__[:0] = build_path(Path(__file__).parent, os.environ)

from gateway.routing.params import (  # noqa: E402 (after the search path is set)
    DEFAULT_POLICY,
    POLICY_NAMES,
    ParamError,
    PolicyName,
    PolicyParams,
)
from gateway.routing.policies import POLICIES, Policy, build_policy  # noqa: E402
from gateway.routing.types import (  # noqa: E402
    Backend,
    BackendLoad,
    Decision,
    LoadSnapshot,
    Reason,
    Role,
    RouteRequest,
    RouterState,
    Slo,
    Stay,
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
    "Stay",
    "build_policy",
]
