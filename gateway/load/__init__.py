"""Backend load: parsing engine metrics (pure) and, later, the monitor that scrapes them."""

from gateway.load.parse import (
    EngineStats,
    MetricsParseError,
    parse_triton_metrics,
    parse_vllm_metrics,
)

__all__ = ["EngineStats", "MetricsParseError", "parse_triton_metrics", "parse_vllm_metrics"]
