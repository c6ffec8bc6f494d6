"""Whether the standard OTEL_* environment variables turn tracing on, read without importing
OpenTelemetry: a gateway with tracing off never loads it (pipeline.tracing builds the rest)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

__all__ = ["trace_exporters"]

log = logging.getLogger(__name__)

_EXPORTERS = ("otlp", "console")


def trace_exporters(environ: Mapping[str, str]) -> list[str]:
    """The span exporters `environ` asks for (`otlp`, `console`); none: tracing off.

    `OTEL_TRACES_EXPORTER` names them (comma-separated; `none` turns tracing off); unset, an
    `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` means `otlp`."""
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    if not names:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    if "none" in names:
        return []
    for unknown in sorted(set(names) - set(_EXPORTERS)):
        log.warning("unsupported OTEL_TRACES_EXPORTER ignored", extra={"fields": {
            "exporter": unknown}})  # fmt: skip
    return [n for n in _EXPORTERS if n in names]
