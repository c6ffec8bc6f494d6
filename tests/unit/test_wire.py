"""Wire adapters: one module per engine kind, found by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway import wire
from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import ConfigError, Settings, load_settings
from gateway.observe.telemetry import Telemetry

ECHO = """
from gateway.wire.vllm.adapter import VllmAdapter


class EchoAdapter(VllmAdapter):
    kind = "echo"
    label = "Echo"
    health_path = "/healthz"


ADAPTER = EchoAdapter()
"""


def test_the_shipped_kinds() -> None:
    assert wire.kinds() == ("triton", "vllm")
    for kind in wire.kinds():
        a = wire.adapter(kind)
        assert a.kind == kind
        assert a.health_path.startswith("/")
    assert wire.adapter("vllm").restricts is False
    assert wire.adapter("triton").restricts is True


def test_an_unknown_kind_is_a_configuration_error_naming_the_choices() -> None:
    tiers = [{"name": "t", "role": "throughput",
              "backends": [{"url": "http://e:1", "models": ["m"], "kind": "sglang"}]}]  # fmt: skip
    with pytest.raises(ConfigError) as err:
        load_settings(None, tiers=tiers)
    assert err.value.problems == (
        "tiers.0.backends.0.kind: unknown engine kind 'sglang'; choose from triton, vllm",
    )
    with pytest.raises(ValueError, match="no wire adapter for engine kind 'sglang'"):
        wire.adapter("sglang")


def test_a_new_kind_is_one_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping a module into the package is all it takes: the configuration accepts the kind
    and the registry gives its backends that adapter."""
    (tmp_path / "echo.py").write_text(ECHO)
    monkeypatch.setattr(wire, "__path__", [*wire.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "gateway.wire.echo", raising=False)
    assert "echo" in wire.kinds()
    settings = Settings(tiers=[{"name": "t", "role": "throughput",
                                "backends": [{"url": "http://e:1", "models": ["m"],
                                              "kind": "echo"}]}])  # fmt: skip
    entry = Registry(settings, MemoryInflightStore(), Telemetry()).entry("http://e:1")
    assert entry.adapter.kind == "echo"
    assert entry.health_url == "http://e:1/healthz"
    sys.modules.pop("gateway.wire.echo", None)
