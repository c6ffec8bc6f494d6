"""The series of vLLM's /metrics page the gateway reads, per `model_name`, summed over the
`engine` label (data-parallel engines of one server)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import urlencode

from gateway.wire.metrics import EngineStats, collect

__all__ = ["METRICS_QUERY", "SERIES", "parse_vllm_metrics"]

KV = "vllm:kv_cache_usage_perc"
KV_OLD = "vllm:gpu_cache_usage_perc"  # removed in vLLM 0.12; older engines still send it
GENERATION = "vllm:generation_tokens_total"

SERIES: Mapping[str, str] = MappingProxyType({
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    KV: "kv",
    KV_OLD: "kv_old",
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    "vllm:request_success_total": "success",
    GENERATION: "generation",
    "vllm:inter_token_latency_seconds_sum": "itl_sum",
    "vllm:inter_token_latency_seconds_count": "itl_count",
    # The same histogram's name before vLLM 0.11 (its meaning was the same: one sample per step).
    "vllm:time_per_output_token_seconds_sum": "itl_sum_old",
    "vllm:time_per_output_token_seconds_count": "itl_count_old",
    "vllm:prompt_tokens_total": "prompt",
    "vllm:prefix_cache_hits_total": "prefix_hits",  # in tokens (vLLM's V1 engine)
    "vllm:request_prefill_time_seconds_sum": "prefill_sum",
    "vllm:request_prefill_time_seconds_count": "prefill_count",
    "vllm:request_prefill_kv_computed_tokens_sum": "prefill_computed",  # (vLLM #30189)
    "vllm:iteration_tokens_total_count": "steps",  # a histogram, one sample per engine step
})  # fmt: skip


# The query for only these series: prometheus_client's page (vLLM's) takes each sample's name
# as a `name[]` parameter.
METRICS_QUERY = urlencode([("name[]", name) for name in SERIES])


def parse_vllm_metrics(text: str) -> dict[str, EngineStats]:
    """Per ``model_name`` stats from a vLLM ``/metrics`` page, summed over ``engine`` labels.

    Raises gateway.wire.metrics.MetricsParseError when a line is not valid exposition text.
    """
    return collect(text, SERIES, "model_name")
