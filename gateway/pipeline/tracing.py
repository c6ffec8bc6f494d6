"""Tracing with OpenTelemetry: off unless the standard environment variables ask for it
(gateway.observe.tracing_env says whether they do; this module is imported only then, or when the
caller passes a tracer provider of its own).

On when `OTEL_TRACES_EXPORTER` names `otlp` or `console` (comma-separated), or when
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set and the exporter is
not `none`. The SDK reads the rest itself: `OTEL_SERVICE_NAME` (default here: tiergate),
`OTEL_TRACES_SAMPLER` (+ `_ARG`), `OTEL_BSP_*`, the exporter's endpoint, headers and timeout.

Off, the gateway holds no `Tracing` and no exchange a `RequestTrace`: the request path checks
`ex.trace is None` and calls nothing here. On, each proxied request has one `RequestTrace`:

    POST /v1/completions (SERVER; continues the client's traceparent)
      admission (queued or not)
        route (policy, reason, tier, candidates, the chosen backend's predicted TPOT/TTFT)
      attempt (CLIENT; one per backend tried, its outcome; its context goes to the engine)
        stream (first byte to the end of the client's stream)
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.core.errors import GatewayError
from gateway.observe.tracing_env import trace_exporters
from gateway.pipeline.retry import Full, Retryable
from gateway.routing import Backend, Decision, Reason, RouteRequest

if TYPE_CHECKING:
    from gateway.backends.registry import Registry
    from gateway.core.exchange import Exchange

__all__ = ["RequestTrace", "Tracing", "provider_from_env"]

_TRACEPARENT, _TRACESTATE = b"traceparent", b"tracestate"


def provider_from_env(environ: Mapping[str, str]) -> TracerProvider | None:
    """The tracer provider the OTEL_* variables in `environ` ask for; None: tracing off."""
    names = trace_exporters(environ)
    if not names:
        return None
    service = environ.get("OTEL_SERVICE_NAME") or "tiergate"
    # The sampler comes from OTEL_TRACES_SAMPLER(_ARG), read by the SDK.
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    return provider


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    # Imported only when used: it brings protobuf and requests along.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


class Tracing:
    """The gateway's tracer (from a provider it is given) and what spans read beyond the
    exchange: the registry's learned curves, for the predictions of a decision."""

    def __init__(self, provider: trace.TracerProvider, registry: Registry) -> None:
        self.tracer = provider.get_tracer("tiergate")
        self.registry = registry
        self.propagator = TraceContextTextMapPropagator()

    def begin(self, ex: Exchange) -> RequestTrace:
        return RequestTrace(self, ex)


class RequestTrace:
    """The spans of one request; the exchange holds it as `ex.trace`."""

    __slots__ = ("attempt_span", "context", "parent", "queued", "span", "streaming_ns", "tracing")

    def __init__(self, tracing: Tracing, ex: Exchange) -> None:
        self.tracing = tracing
        carrier = {k.decode(): v.decode("latin-1") for k in (_TRACEPARENT, _TRACESTATE)
                   if (v := ex.headers.get(k)) is not None}  # fmt: skip
        incoming = tracing.propagator.extract(carrier) if carrier else None
        self.span = tracing.tracer.start_span(
            f"POST {ex.endpoint.path}", incoming, trace.SpanKind.SERVER,
            {"http.request.method": "POST", "url.path": ex.endpoint.path,
             "tiergate.request.id": ex.id},
        )  # fmt: skip
        self.context = trace.set_span_in_context(self.span)
        self.parent = self.context  # where the next child span goes
        self.attempt_span: trace.Span | None = None
        self.streaming_ns: int | None = None
        self.queued = False  # the first decision found every backend saturated

    # -- admission and routing -------------------------------------------------------------
    async def admit(self, admitting: Awaitable[Decision]) -> Decision:
        """`admitting` (the admission of this request) inside an `admission` span."""
        span = self.tracing.tracer.start_span("admission", self.context)
        self.parent = trace.set_span_in_context(span)
        try:
            decision = await admitting
            if self.queued:  # decided again after the wait: the decision it went out with
                span.set_attribute("tiergate.route.reason", decision.reason)
        except GatewayError as e:
            span.set_attribute("tiergate.rejected", e.reason or str(e.status))
            span.set_attribute("http.response.status_code", e.status)
            raise
        finally:
            span.set_attribute("tiergate.queued", self.queued)
            self.parent = self.context
            span.end()
        return decision

    def route(self, decide: Callable[[RouteRequest], Decision], req: RouteRequest) -> Decision:
        """`decide(req)` inside a `route` span."""
        span = self.tracing.tracer.start_span("route", self.parent)
        try:
            decision = decide(req)
            self.queued = decision.reason == Reason.SATURATED
            span.set_attributes({
                "tiergate.route.policy": decision.policy,
                "tiergate.route.reason": decision.reason,
                "tiergate.route.candidates": [b.url for b in decision.candidates],
            })  # fmt: skip
            if decision.affinity:
                span.set_attribute("tiergate.route.affinity", decision.affinity)
            if (chosen := decision.primary) is not None:
                span.set_attribute("tiergate.route.tier", chosen.tier)
                self._predicted(span, chosen)
        finally:
            span.end()
        return decision

    def _predicted(self, span: trace.Span, chosen: Backend) -> None:
        """The learned model's TPOT and TTFT for the chosen backend with one more stream than
        it has now (its scraped queue or this gateway's in-flight count, the larger)."""
        registry = self.tracing.registry
        pred = registry.curves.get(chosen.url)
        if pred is None or not pred.known:
            return
        entry = registry.entries.get(chosen.url)
        if entry is None:
            return
        n = max(entry.live.running + entry.live.waiting, entry.busy) + 1
        span.set_attribute("tiergate.route.predicted_tpot_s", pred.tpot.at(n))
        span.set_attribute("tiergate.route.predicted_ttft_s", pred.ttft.at(n))

    # -- upstream --------------------------------------------------------------------------
    @contextmanager
    def attempt(self, ex: Exchange, backend: Backend) -> Iterator[None]:
        """An `attempt` span around one attempt at `backend`, with its outcome."""
        span = self.tracing.tracer.start_span(
            "attempt", self.context, trace.SpanKind.CLIENT,
            {"url.full": backend.url + ex.endpoint.path, "tiergate.backend": backend.url,
             "tiergate.tier": backend.tier, "tiergate.attempt": ex.attempts + 1},
        )  # fmt: skip
        self.attempt_span, self.streaming_ns = span, None
        outcome, status = "ok", 0
        try:
            yield
            status = ex.status
        except Full:
            outcome = "full"
            raise
        except Retryable as e:
            outcome, status = e.reason, e.status or 0
            raise
        except BaseException as e:
            outcome = type(e).__name__
            raise
        finally:
            span.set_attribute("tiergate.outcome", outcome)
            if status:
                span.set_attribute("http.response.status_code", status)
            if outcome != "ok" or status >= 500:
                span.set_status(trace.StatusCode.ERROR, outcome)
            if ex.backend is not None and ex.backend.url != backend.url and outcome == "ok":
                span.set_attribute("tiergate.hedged_to", ex.backend.url)
            self._end_stream(ex, span)
            span.end()

    def streaming(self) -> None:
        """The stream to the client starts (its first byte is in hand)."""
        self.streaming_ns = time.time_ns()

    def _end_stream(self, ex: Exchange, attempt: trace.Span) -> None:
        if self.streaming_ns is None:
            return
        span = self.tracing.tracer.start_span(
            "stream", trace.set_span_in_context(attempt), start_time=self.streaming_ns
        )
        span.set_attribute("tiergate.text_events", ex.text_events)
        if ex.output_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", ex.output_tokens)
        if ex.continuations:
            span.set_attribute("tiergate.continuations", ex.continuations)
        if ex.midstream_error is not None:
            span.set_attribute("tiergate.midstream_error", ex.midstream_error)
            span.set_status(trace.StatusCode.ERROR, ex.midstream_error)
        span.end()
        self.streaming_ns = None

    def inject(self, headers: dict[str, str]) -> None:
        """The current attempt's traceparent (and tracestate) into an engine request's headers."""
        span = self.attempt_span or self.span
        self.tracing.propagator.inject(headers, trace.set_span_in_context(span))

    # -- the end ---------------------------------------------------------------------------
    def end(self, ex: Exchange) -> None:
        span = self.span
        attributes: dict[str, str | bool | int] = {
            "tiergate.stream": ex.stream, "tiergate.attempts": ex.attempts,
        }  # fmt: skip
        if ex.model:
            attributes["gen_ai.request.model"] = ex.model
        if ex.status:
            attributes["http.response.status_code"] = ex.status
        if ex.backend is not None:
            attributes["tiergate.tier"] = ex.backend.tier
            attributes["tiergate.backend"] = ex.backend.url
        span.set_attributes(attributes)
        if ex.status >= 500:
            span.set_status(trace.StatusCode.ERROR)
        span.end()
