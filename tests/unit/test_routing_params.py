"""Policy names and parameters, defined once (gateway.routing.params), and how the catalog builds
each policy from them (gateway.routing.build_policy)."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import ValidationError

from gateway.config.settings import PolicyConfig
from gateway.routing import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    ParamError,
    Policy,
    PolicyName,
    PolicyParams,
    Role,
    build_policy,
)
from gateway.routing.baselines import LeastLoaded, RoundRobin, TierFirst
from gateway.routing.golden import GoldenRange, Hysteresis
from gateway.routing.order import Ordering
from gateway.routing.saturation import Saturation
from tests.unit.routingfixtures import P


def test_names_defined_once() -> None:
    assert get_args(PolicyName) == POLICY_NAMES
    assert POLICY_NAMES == (
        "learned",
        "golden-range",
        "least-loaded",
        "power-of-two",
        "round-robin",
        "latency-only",
        "throughput-only",
    )
    assert DEFAULT_POLICY == "learned"
    assert DEFAULT_POLICY in POLICY_NAMES


@pytest.mark.parametrize(
    ("field", "default"),
    [
        ("latency_max_concurrency", 16),
        ("hysteresis", 2),
        ("latency_hard_cap", 24),
        ("max_waiting", 8),
        ("p2c_min_pool", 4),
        ("slo_margin", 0.02),
        ("explore_rate", 0.02),
        ("explore_after_s", 10.0),
        ("full_ttft_factor", 2.0),
        ("affinity_balance", 0.25),
        ("affinity_slack", 2),
        ("prefix_affinity", True),
        ("affinity_yield", 2.0),
        ("affinity_keys", 65536),
        ("affinity_quiet_after", 1024),
        ("affinity_quiet_every", 16),
        ("affinity_ttl_s", 600.0),
    ],
)
def test_defaults(field: str, default: float) -> None:
    assert getattr(P, field) == default
    assert PolicyParams.model_fields[field].description


def test_every_parameter_is_listed_above() -> None:
    assert set(PolicyParams.model_fields) == {
        "latency_max_concurrency",
        "hysteresis",
        "latency_hard_cap",
        "max_waiting",
        "p2c_min_pool",
        "slo_margin",
        "explore_rate",
        "explore_after_s",
        "full_ttft_factor",
        "affinity_balance",
        "affinity_slack",
        "prefix_affinity",
        "affinity_yield",
        "affinity_keys",
        "affinity_quiet_after",
        "affinity_quiet_every",
        "affinity_ttl_s",
    }


def _named_field(exc: ValidationError) -> str:
    """The field a validation error points at: its location, else the ParamError's field."""
    (error,) = exc.errors()
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ParamError):
        return cause.field
    return ".".join(str(part) for part in error["loc"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"latency_max_concurrency": 0}, "latency_max_concurrency", id="cap-zero"),
        pytest.param({"hysteresis": 16}, "hysteresis", id="hysteresis-not-below-cap"),
        pytest.param({"hysteresis": -1}, "hysteresis", id="negative-hysteresis"),
        pytest.param(
            {"latency_max_concurrency": 4, "hysteresis": 4}, "hysteresis", id="hysteresis-at-cap"
        ),
        pytest.param({"latency_hard_cap": 0}, "latency_hard_cap", id="hard-cap-zero"),
        pytest.param({"latency_hard_cap": 15}, "latency_hard_cap", id="hard-cap-below-cap"),
        pytest.param(
            {"latency_max_concurrency": 30},
            "latency_hard_cap",
            id="cap-above-default-hard-cap",
        ),
        pytest.param({"max_waiting": -1}, "max_waiting", id="negative-max-waiting"),
        pytest.param({"p2c_min_pool": 1}, "p2c_min_pool", id="p2c-pool-of-one"),
        pytest.param({"p2c_min_pool": "many"}, "p2c_min_pool", id="not-a-number"),
        pytest.param({"hysterisis": 1}, "hysterisis", id="typo-is-not-ignored"),
    ],
)
def test_rejects(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        PolicyParams(**kwargs)
    assert _named_field(info.value) == field


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"latency_max_concurrency": 1, "hysteresis": 0}, id="smallest-golden-range"),
        pytest.param({"hysteresis": 15}, id="hysteresis-just-below-cap"),
        pytest.param({"hysteresis": 0}, id="no-hysteresis"),
        pytest.param({"latency_hard_cap": 16}, id="hard-cap-equal-to-cap"),
        pytest.param({"max_waiting": 0}, id="any-queue-saturates"),
        pytest.param({"p2c_min_pool": 2}, id="two-choices-from-two"),
    ],
)
def test_accepts_the_boundaries(kwargs: dict[str, int]) -> None:
    params = PolicyParams(**kwargs)
    assert params.model_dump() == {**P.model_dump(), **kwargs}


def test_param_error_names_its_field() -> None:
    err = ParamError("hysteresis", "must be < latency_max_concurrency (16), got 16")
    assert isinstance(err, ValueError)
    assert (err.field, err.reason) == (
        "hysteresis",
        "must be < latency_max_concurrency (16), got 16",
    )
    assert str(err) == "hysteresis: must be < latency_max_concurrency (16), got 16"


def test_params_are_frozen() -> None:
    with pytest.raises(ValidationError, match="frozen"):
        P.hysteresis = 5  # type: ignore[misc]
    assert PolicyParams(hysteresis=3) == PolicyParams(hysteresis=3)
    assert hash(PolicyParams(hysteresis=3)) == hash(PolicyParams(hysteresis=3))


# Each policy takes from the block what it reads, once, at build time.
BUILT: dict[str, tuple[str, PolicyParams, Policy]] = {
    "golden-range": (
        "golden-range",
        PolicyParams(latency_max_concurrency=10, hysteresis=3, latency_hard_cap=12),
        GoldenRange(
            name="golden-range",
            hysteresis=Hysteresis(close_at=10, reopen_below=7),
            order=Ordering(Saturation(latency_hard_cap=12, max_waiting=8), p2c_min_pool=4),
        ),
    ),
    "least-loaded": (
        "least-loaded",
        PolicyParams(latency_hard_cap=30, max_waiting=3, p2c_min_pool=9),
        LeastLoaded(name="least-loaded", saturation=Saturation(30, 3)),
    ),
    "round-robin": (
        "round-robin",
        PolicyParams(max_waiting=0),
        RoundRobin(name="round-robin", saturation=Saturation(24, 0)),
    ),
    "latency-only": (
        "latency-only",
        PolicyParams(p2c_min_pool=2),
        TierFirst("latency-only", Role.LATENCY, Ordering(Saturation(24, 8), p2c_min_pool=2)),
    ),
    "throughput-only": (
        "throughput-only",
        PolicyParams(max_waiting=5),
        TierFirst("throughput-only", Role.THROUGHPUT, Ordering(Saturation(24, 5), 4)),
    ),
}


@pytest.mark.parametrize(("name", "params", "expected"), BUILT.values(), ids=BUILT.keys())
def test_build_takes_what_each_policy_reads(
    name: str, params: PolicyParams, expected: Policy
) -> None:
    assert build_policy(name, params) == expected


def test_build_from_the_settings_block() -> None:
    """The gateway passes its PolicyConfig (PolicyParams plus name, seed, queue deadline): the
    policy keeps only the routing parameters."""
    cfg = PolicyConfig(name="golden-range", latency_max_concurrency=8, hysteresis=1, seed=3)
    assert build_policy(cfg.name, cfg) == build_policy(
        "golden-range", PolicyParams(latency_max_concurrency=8, hysteresis=1)
    )


@pytest.mark.parametrize(
    ("params", "field"),
    [
        pytest.param(P.model_copy(update={"hysteresis": 16}), "hysteresis", id="model-copy"),
        pytest.param(
            PolicyParams.model_construct(latency_hard_cap=3), "latency_hard_cap", id="construct"
        ),
        pytest.param(P.model_copy(update={"p2c_min_pool": 1}), "p2c_min_pool", id="bound"),
    ],
)
def test_build_validates_a_block_that_skipped_validation(params: PolicyParams, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_policy("golden-range", params)
    assert _named_field(info.value) == field


def test_build_unknown_name() -> None:
    with pytest.raises(ParamError, match=r"'random'.*golden-range, least-loaded") as info:
        build_policy("random", P)
    assert info.value.field == "name"
