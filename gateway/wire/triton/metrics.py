"""The series of Triton's metrics page (port 8002 by default) the gateway reads, per `model`,
summed over versions."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.wire.metrics import EngineStats, collect
from gateway.wire.vllm.metrics import GENERATION, KV, KV_OLD

__all__ = ["SERIES", "parse_triton_metrics"]

# Triton's own pending count and successes; the Triton vLLM backend re-exports vLLM's counters
# (and, in older versions, its gauges) labelled `model`: KV usage when present, and the
# generated-token counter the stall check reads.
SERIES: Mapping[str, str] = MappingProxyType({
    "nv_inference_pending_request_count": "waiting",
    "nv_inference_request_success": "success",
    KV: "kv",
    KV_OLD: "kv_old",
    GENERATION: "generation",
})  # fmt: skip


def parse_triton_metrics(text: str) -> dict[str, EngineStats]:
    """Per ``model`` stats from Triton's metrics page, summed over versions.

    Triton exports no running gauge, so ``running`` is 0 and the pending count is ``waiting``;
    the gateway's own in-flight count carries the rest.
    """
    return collect(text, SERIES, "model")
