"""The engine kinds the gateway ships, by name: the table a backend's `kind` is checked against
and the assembly's default (gateway.serve.assembly.Hosting.kinds). A kind of one's own is passed
to the assembly beside these: `Hosting(kinds=table(*BUILTIN.values(), mine))`."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway import wire
from gateway.wire import triton, vllm

__all__ = ["BUILTIN", "table"]


def table(*kinds: wire.EngineKind) -> Mapping[str, wire.EngineKind]:
    """Kinds by name (read-only)."""
    return MappingProxyType({k.name: k for k in kinds})


BUILTIN = table(vllm.KIND, triton.KIND)
