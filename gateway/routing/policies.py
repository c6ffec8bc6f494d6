"""The policy catalog: each policy name and how to build that policy from its parameters.

A policy is built once (``build_policy``) and then called per request with
(request, snapshot, state, rng). No I/O, no clock: everything a policy may look at is passed in,
the only randomness is the caller's seeded ``random.Random``, and what a policy remembers comes
back in ``Decision.state`` for the caller to pass to the next call. The same inputs give the same
decision, so any routing choice can be replayed from a log.

Every policy returns a full failover order (primary first), honours the ``x-tiergate-tier`` pin
strictly (a pinned request never fails over to the other tier) and reports ``saturated`` when no
candidate has room.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

from gateway.routing.baselines import LeastLoaded, PowerOfTwo, RoundRobin, TierFirst
from gateway.routing.golden import GoldenRange
from gateway.routing.learned import Learned
from gateway.routing.params import (
    POLICY_NAMES,
    ParamError,
    PolicyName,
    PolicyParams,
    is_policy_name,
)
from gateway.routing.types import Decision, LoadSnapshot, RouteRequest, RouterState

__all__ = ["POLICIES", "Builder", "Policy", "build_policy"]


class Policy(Protocol):
    """A routing policy, built from its parameters, called once per request."""

    # Read-only, so frozen policy objects satisfy it; the Decision's ``policy`` label.
    @property
    def name(self) -> str: ...

    def __call__(
        self, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision: ...


Builder = Callable[[str, PolicyParams], Policy]

POLICIES: Mapping[PolicyName, Builder] = MappingProxyType(
    {
        "learned": Learned.build,
        "golden-range": GoldenRange.build,
        "least-loaded": LeastLoaded.build,
        "power-of-two": PowerOfTwo.build,
        "round-robin": RoundRobin.build,
        "latency-only": TierFirst.latency_first,
        "throughput-only": TierFirst.throughput_first,
    }
)


def build_policy(name: str, params: PolicyParams) -> Policy:
    """The policy called ``name``, built from ``params``; a ParamError for ``name`` that lists
    the valid names otherwise.

    ``params`` is validated here, once: ``model_copy(update=...)`` and ``model_construct`` skip
    pydantic's checks, and a settings block that extends PolicyParams carries more than the
    routing parameters, which the built policy should not hold on to.
    """
    if not is_policy_name(name):
        choices = ", ".join(POLICY_NAMES)
        raise ParamError("name", f"unknown routing policy {name!r}; choose from {choices}")
    checked = PolicyParams.model_validate(
        {field: getattr(params, field) for field in PolicyParams.model_fields}
    )
    return POLICIES[name](name, checked)
