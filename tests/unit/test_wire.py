"""Engine kinds: one folder each, checked against a static table, each with its own options."""

from __future__ import annotations

import pytest

from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import ConfigError, Settings, load_settings
from gateway.observe.telemetry import Telemetry
from gateway.wire.kinds import BUILTIN, table
from gateway.wire.triton.options import TritonOptions
from gateway.wire.vllm.options import VllmOptions
from tests.integration import echo_kind

WITH_ECHO = table(*BUILTIN.values(), echo_kind.KIND)


def tiers(**backend: object) -> list[dict[str, object]]:
    return [{"name": "t", "role": "throughput",
             "backends": [{"url": "http://e:1", "models": ["m"], **backend}]}]  # fmt: skip


def test_the_shipped_kinds() -> None:
    assert sorted(BUILTIN) == ["triton", "vllm"]
    for name, kind in BUILTIN.items():
        assert kind.name == kind.adapter.kind == name
        assert kind.adapter.health_path.startswith("/")
    assert BUILTIN["vllm"].adapter.restricts is False
    assert BUILTIN["triton"].adapter.restricts is True
    # Continuations (a rebuilt OpenAI body) go only where the body passes through.
    assert (BUILTIN["vllm"].adapter.passthrough, BUILTIN["triton"].adapter.passthrough) == (
        True, False)
    assert (BUILTIN["vllm"].options, BUILTIN["triton"].options) == (VllmOptions, TritonOptions)


@pytest.mark.parametrize(
    ("backend", "kinds", "problem"),
    [
        ({"kind": "sglang"}, BUILTIN,
         "tiers.0.backends.0.kind: unknown engine kind 'sglang'; choose from triton, vllm"),
        ({"kind": "echo"}, BUILTIN,
         "tiers.0.backends.0.kind: unknown engine kind 'echo'; choose from triton, vllm"),
        # An option of another kind, named as such; an option of no kind, a typo.
        ({"triton_grpc": "t:8001"}, BUILTIN,
         "tiers.0.backends.0.triton_grpc: only applies to backends of kind triton"),
        ({"priority_scheduling": True, "kind": "triton"}, BUILTIN,
         "tiers.0.backends.0.priority_scheduling: only applies to backends of kind vllm"),
        ({"echo_prefix": "x"}, WITH_ECHO,
         "tiers.0.backends.0.echo_prefix: only applies to backends of kind echo"),
        ({"echo_prefix": "x"}, BUILTIN,
         "tiers.0.backends.0.echo_prefix: Extra inputs are not permitted"),
        ({"kind": "echo", "echo_prefix": "x" * 17}, WITH_ECHO,
         "tiers.0.backends.0.echo_prefix: String should have at most 16 characters"),
        ({"kind": "Echo!"}, WITH_ECHO,
         "tiers.0.backends.0.kind: String should match pattern '^[a-z][a-z0-9_-]*$'"),
    ],
)  # fmt: skip
def test_a_kind_and_its_options_are_checked_against_the_table(
    backend: dict[str, object], kinds: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, kinds=kinds, tiers=tiers(**backend))  # type: ignore[arg-type]
    assert err.value.problems == (problem,)


def test_a_new_kind_is_one_folder_handed_to_the_gateway() -> None:
    """The echo kind's folder is all it takes: the configuration accepts the kind and its
    option, and the registry gives its backends that adapter, options and readiness."""
    settings = load_settings(None, kinds=WITH_ECHO, tiers=tiers(kind="echo", echo_prefix="> "))
    registry = Registry(settings, MemoryInflightStore(), Telemetry(), kinds=WITH_ECHO)
    entry = registry.entry("http://e:1")
    assert entry.adapter.kind == "echo"
    assert entry.health_url == "http://e:1/no-such-path"
    assert entry.options == echo_kind.options.EchoOptions(echo_prefix="> ")
    assert entry.own_transport is None
    assert entry.kind.readiness(entry, None, 1.0) is not None
    assert registry.restricted == ((echo_kind.KIND.adapter, frozenset({"http://e:1"})),)


def test_settings_alone_keep_a_kinds_options_until_the_kind_reads_them() -> None:
    s = Settings(tiers=tiers(kind="triton", triton_grpc="t:8001"))
    assert s.tiers[0].backends[0].kind_options == {"triton_grpc": "t:8001"}
