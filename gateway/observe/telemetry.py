"""The gateway's Prometheus metrics (prefix `tiergate_`) and its logging setup.

One `Telemetry` per app, with its own registry. Label children are cached, so a series costs a
dictionary lookup, not label resolution; the request path's series are summed in plain dicts
and handed to them when /metrics is read (`Telemetry.add`).
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from gateway.core.exchange import Exchange

log = logging.getLogger("gateway.request")

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    30.0,
)
TPOT_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.0125,
    0.015,
    0.0175,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
)


# SLO classes for metric labels: a request's TPOT target is counted under the first class that
# is at least as long, so clients choosing their own targets cannot grow the label set.
SLO_CLASSES_MS = (5, 8, 10, 12, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500, 1000)


@functools.lru_cache(maxsize=256)
def slo_class(tpot_s: float) -> str:
    ms = tpot_s * 1000
    for c in SLO_CLASSES_MS:
        if ms <= c + 1e-9:
            return f"tpot<={c}ms"
    return f"tpot>{SLO_CLASSES_MS[-1]}ms"


class Telemetry:
    """The gateway's metrics. With several workers (`tiergate serve --workers N`) each worker's
    values live in files of prometheus_client's multiprocess mode (the supervisor sets
    PROMETHEUS_MULTIPROC_DIR before it starts them) and /metrics reads every worker's: counters
    and histograms summed, each gauge as its `multiprocess_mode` says (in-flight and queued
    counts summed; the views every worker has of the same engine, the most recent)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        # The cycle collector's work (`python_gc_*`, read from the interpreter at each scrape):
        # a request path that leaves reference cycles behind shows here as objects collected
        # per request, and costs CPU in every collection. (One process's own: with several
        # workers /metrics reads the workers' files, which hold none of this.)
        GCCollector(registry=r)
        # Requests this process completed (in /state: which worker served how many).
        self.served = 0
        self.requests = Counter(
            "tiergate_requests",
            "Proxied requests by serving tier, backend and final status.",
            ("tier", "backend", "model", "status"),
            registry=r,
        )
        self.decisions = Counter(
            "tiergate_routing_decisions",
            "Routing decisions by policy, reason and chosen tier.",
            ("policy", "reason", "tier"),
            registry=r,
        )
        self.affinity = Counter(
            "tiergate_affinity_decisions",
            "Requests with a home (a conversation's earlier turn, a repeated prefix) or a declared"
            " session, by what prefix affinity did: home or session (served first at its home,"
            " or its own backend), else the check that sent it elsewhere (gone, policy,"
            " saturated, queue, full, miss, unknown, give_way, past_knee), and the tier it was"
            " sent to first (where a move went: a pool conversation coming up to the latency"
            " tier, or one leaving it).",
            ("outcome", "tier"),
            registry=r,
        )
        self.retries = Counter(
            "tiergate_retries",
            "Retries: attempts started on the next candidate after an attempt failed before its"
            " first byte, by the failed backend and why it failed.",
            ("backend", "reason"),
            registry=r,
        )
        self.attempts = Counter(
            "tiergate_attempts",
            "Attempts on the engines by outcome: ok (a first byte came), or why it failed"
            " before its first byte (http_<status>, auth, ejected, a connection error...).",
            ("backend", "outcome"),
            registry=r,
        )
        self.failovers = Counter(
            "tiergate_failovers",
            "Requests served by a different tier than first chosen.",
            ("from_tier", "to_tier"),
            registry=r,
        )
        self.rejected = Counter(
            "tiergate_rejected",
            "Requests answered by the gateway itself with an error.",
            ("reason",),
            registry=r,
        )
        self.continuations = Counter(
            "tiergate_continuations",
            "Streams that broke after their first byte and were continued on another backend"
            " (continued), could not be (impossible: finished, several choices, a prompt of"
            " token ids, opted out), or found no backend to continue on (failed).",
            ("outcome",),
            registry=r,
        )
        self.hedges = Counter(
            "tiergate_hedges",
            "Streams whose first token was late, sent to a second backend too: won (the hedge"
            " answered first) or lost (the slow one did).",
            ("outcome",),
            registry=r,
        )
        self.midstream_errors = Counter(
            "tiergate_midstream_errors",
            "Streams that failed after the first byte.",
            ("tier", "backend"),
            registry=r,
        )
        self.inflight = Gauge(
            "tiergate_inflight",
            "Requests in flight through this gateway, by backend.",
            ("tier", "backend"),
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queued = Gauge(
            "tiergate_queued",
            "Requests held at the gateway because every backend is saturated.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.backend_queue = Gauge(
            "tiergate_backend_queue_depth",
            "Scraped engine queue depth.",
            ("tier", "backend", "state"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_kv = Gauge(
            "tiergate_backend_kv_usage",
            "Scraped engine KV-cache usage (0..1).",
            ("tier", "backend"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_up = Gauge(
            "tiergate_backend_up",
            "1 while the backend is healthy and not ejected.",
            ("tier", "backend"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_scrape_age = Gauge(
            "tiergate_backend_scrape_age_seconds",
            "Age of the last good scrape.",
            ("tier", "backend"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_spec_acceptance = Gauge(
            "tiergate_backend_spec_acceptance_rate",
            "Speculative decoding draft acceptance rate (accepted / draft tokens), as scraped.",
            ("tier", "backend"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.ejections = Counter(
            "tiergate_backend_ejections",
            "Times a backend was taken out of rotation.",
            ("tier", "backend", "reason"),
            registry=r,
        )
        self.state_up = Gauge(
            "tiergate_state_store_up",
            "1 while the shared in-flight store (Redis) is reachable.",
            ("store",),
            registry=r,
            multiprocess_mode="livemin",
        )
        self.duration = Histogram(
            "tiergate_request_duration_seconds",
            "Request latency at the gateway, to last byte.",
            ("tier", "model"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "tiergate_ttft_seconds",
            "Time to first token of streamed requests, at the gateway.",
            ("tier", "model"),
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "tiergate_tpot_seconds",
            "Time per output token after the first, streamed requests.",
            ("tier", "model"),
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        # Gray releases (gateway.pipeline.releases): each variant's outcomes and latency, live and
        # in shadow mode, to compare a new version with the old before shifting weight to it.
        self.release_requests = Counter(
            "tiergate_release_requests_total",
            "Requests of gray releases by variant; mode live (answered to the client) or "
            "shadow (a copy, answer discarded); outcome ok, client_error (4xx) or error (5xx, "
            "or a stream that broke).",
            ("release", "variant", "mode", "outcome"),
            registry=r,
        )
        self.release_duration = Histogram(
            "tiergate_release_duration_seconds",
            "Latency to last byte of gray releases' requests, by variant and mode.",
            ("release", "variant", "mode"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.release_ttft = Histogram(
            "tiergate_release_ttft_seconds",
            "Time to first token of gray releases' streamed requests, by variant and mode.",
            ("release", "variant", "mode"),
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.shadow_dropped = Counter(
            "tiergate_shadow_dropped_total",
            "Shadow copies not sent: too many in flight (busy), or no backend had room.",
            ("release", "variant", "reason"),
            registry=r,
        )
        # Tenants (gateway.pipeline.tenants, gateway.pipeline.limits), labelled by name only, never
        # by key.
        self.tenant_requests = Counter(
            "tiergate_tenant_requests_total",
            "Requests of named API keys, by key name and status.",
            ("tenant", "status"),
            registry=r,
        )
        self.tenant_tokens = Counter(
            "tiergate_tenant_tokens_total",
            "Prompt + completion tokens of named API keys' answers, as the engines' usage "
            "reports them.",
            ("tenant",),
            registry=r,
        )
        self.rate_limited = Counter(
            "tiergate_rate_limited_total",
            "Requests refused (429) by a key's limit: requests, tokens or concurrency.",
            ("tenant", "limit"),
            registry=r,
        )
        self.displaced = Counter(
            "tiergate_displaced_total",
            "Batch requests whose place, before their first byte, went to an interactive one "
            "(they go back to the admission queue).",
            ("tier", "backend"),
            registry=r,
        )
        self.limits_degraded = Gauge(
            "tiergate_limits_degraded",
            "1 while Redis does not answer and rate limits are counted per gateway process.",
            registry=r,
            multiprocess_mode="max",
        )
        self.output_tokens = Counter(
            "tiergate_output_tokens",
            "Output tokens of streamed requests (from usage if sent).",
            ("tier", "model"),
            registry=r,
        )
        self.predicted_tpot = Gauge(
            "tiergate_backend_predicted_tpot_seconds",
            "The latency model's predicted TPOT of a backend at a given number of streams.",
            ("tier", "backend", "concurrency"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.frontier = Gauge(
            "tiergate_backend_frontier",
            "The most streams the latency model has observed on a backend: its curve rests on"
            " observations up to here (0: none yet).",
            ("tier", "backend"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.prefill_cost = Gauge(
            "tiergate_backend_prefill_seconds_per_token",
            "What a prompt token prefilled beside the decodes adds to a backend's step, as the"
            " latency model learned it (0: none learned); its curve is the step without it.",
            ("tier", "backend"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.latency_limit = Gauge(
            "tiergate_latency_tier_limit",
            "The most streams at which a latency backend is predicted to meet the default TPOT"
            " SLO: the golden range the learned policy found.",
            ("backend",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        # The planner's output and inputs (gateway.serve.planning), for autoscalers.
        self.desired_replicas = Gauge(
            "tiergate_tier_desired_replicas",
            "The replicas of a tier that the planner finds meet every SLO class's forecast"
            " demand at the least cost (within the tier's configured minimum and maximum).",
            ("tier",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.planned_load = Gauge(
            "tiergate_tier_planned_load_replicas",
            "Replicas' worth of the forecast demand the plan puts on a tier (fractional). Summed"
            " over gateway replicas, each planning for the traffic it sees, it is the whole"
            " deployment's: an autoscaler may follow ceil(sum) (docs/autoscaling.md).",
            ("tier",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.tier_replicas = Gauge(
            "tiergate_tier_replicas",
            "A tier's backends in rotation (healthy, not leaving) when the planner last ran.",
            ("tier",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.replica_capacity = Gauge(
            "tiergate_tier_replica_capacity_rps",
            "Requests per second one replica of a tier completes within an SLO class, from its"
            " learned curves (0: none within it, or nothing learned yet).",
            ("tier", "slo_class"),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.demand = Gauge(
            "tiergate_demand_rps",
            "An SLO class's arrivals per second as the planner forecasts them (over a replica's"
            " start-up, with headroom).",
            ("slo_class",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.demand_unmet = Gauge(
            "tiergate_demand_unmet",
            "1 where no tier, even at its maximum, serves an SLO class's demand within its SLO.",
            ("slo_class",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.discovered = Gauge(
            "tiergate_discovered_backends",
            "Backends a tier's discovery (DNS or the Kubernetes API) found in its last good"
            " answer.",
            ("tier",),
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.discovery_answers = Counter(
            "tiergate_discovery_answers",
            "Answers of a tier's discovery source, by outcome (error: it failed or found"
            " nothing, and the tier kept its backends).",
            ("tier", "source", "outcome"),
            registry=r,
        )
        self.slo_met = Counter(
            "tiergate_slo_met",
            "Streamed requests that met their TTFT and TPOT SLO, by tier and SLO class (the TPOT"
            " target, rounded up to a class).",
            ("tier", "slo"),
            registry=r,
        )
        self.slo_missed = Counter(
            "tiergate_slo_missed",
            "Streamed requests that missed their TTFT or TPOT SLO, by tier and SLO class.",
            ("tier", "slo"),
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}
        # What the request path added and observed since the last `flush` (see `add`).
        self._added: dict[tuple[Any, ...], float] = {}
        self._observed: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}
        # Rare outcomes exist at 0 from the start: a series born at its first event has no
        # earlier sample, so rate() and increase() would not count that event.
        for outcome in ("won", "lost"):
            self.child(self.hedges, outcome)
        for outcome in ("continued", "impossible", "failed"):
            self.child(self.continuations, outcome)

    def forget_backend(self, url: str) -> None:
        """Remove every series of a backend that left the pool (discovery). Kept with several
        workers, whose files prometheus_client cannot remove series from."""
        self._children = {k: c for k, c in self._children.items() if url not in k[1:]}
        self._added = {k: v for k, v in self._added.items() if url not in k[1:]}
        self._observed = {k: v for k, v in self._observed.items() if url not in k[1:]}
        if self.multiprocess_dir is not None:
            return
        for metric in vars(self).values():
            if isinstance(metric, MetricWrapperBase) and "backend" in metric._labelnames:
                metric.remove_by_labels({"backend": url})

    def child(self, metric: Any, *labels: str) -> Any:
        """Cached `metric.labels(*labels)`."""
        key = (id(metric), *labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    # -- the request path's series, summed between reads --------------------------------------
    # A prometheus_client child's inc() runs four Python calls and takes a lock (4,900
    # instructions on Python 3.11, twice `add`'s, before the child's lookup:
    # docs/results/instructions-request-path), and a small request counts six series. The
    # request path adds to plain dicts instead, and `flush` hands each series its sum when
    # /metrics is read. Not with several workers: there each count goes to the worker's file
    # at once, since another worker's page reads it, and a worker killed would take its
    # unflushed counts with it.

    def add(self, key: tuple[Any, ...], amount: float = 1.0) -> None:
        """Add `amount` to the series `key` ((counter or gauge, *its labels)), at the next
        `flush` (at once with several workers)."""
        if self.multiprocess_dir is not None:
            self.child(*key).inc(amount)
            return
        added = self._added
        added[key] = added.get(key, 0.0) + amount

    def observe(self, key: tuple[Any, ...], value: float) -> None:
        """Observe `value` in the histogram series `key` ((histogram, *its labels)) at the
        next `flush` (at once with several workers): counted in the first bucket whose bound is
        at least `value`, as prometheus_client's observe() counts it."""
        if self.multiprocess_dir is not None:
            self.child(*key).observe(value)
            return
        seen = self._observed.get(key)
        if seen is None:
            # The series' own bounds, +Inf left out (the library's values, as in
            # `_observe_counted`).
            bounds = self.child(*key)._upper_bounds[:-1]
            seen = self._observed[key] = (bounds, [0.0] * (len(bounds) + 2))
        bounds, counts = seen
        counts[bisect.bisect_left(bounds, value)] += 1  # past every bound: the +Inf bucket
        counts[-1] += value

    def flush(self) -> None:
        """Hand what the request path added and observed to prometheus_client's series."""
        added, self._added = self._added, {}
        for key, amount in added.items():
            if amount:  # a gauge's +1 and -1 of one request
                self.child(*key).inc(amount)
        observed, self._observed = self._observed, {}
        for key, (_, counts) in observed.items():
            _observe_counted(self.child(*key), counts)

    def exposition(self) -> bytes:
        """The /metrics page: this process's metrics, or every worker's."""
        self.flush()
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        every = CollectorRegistry()
        MultiProcessCollector(every, self.multiprocess_dir)  # type: ignore[no-untyped-call]
        return generate_latest(every)

    def record(self, ex: Exchange) -> None:
        """Metrics and the log line of one proxied request, once it is over."""
        self.served += 1
        b, model = ex.backend, ex.model
        tier = b.role if b else "none"  # a StrEnum: its value as a label
        self.add((self.requests, tier, b.url if b else "none", model, str(ex.status)))
        elapsed = time.perf_counter() - ex.started
        if b is not None:
            self.observe((self.duration, tier, model), elapsed)
            first = ex.decision.primary
            if first is not None and b.role is not first.role:
                self.add((self.failovers, first.role, tier))
            if ex.midstream_error:
                self.add((self.midstream_errors, tier, b.url))
            ttft = ex.ttft
            if ttft is not None:
                # Streamed: the gateway's own TTFT and TPOT (vllm bench serve's definitions).
                self.observe((self.ttft, tier, model), ttft)
                self.add((self.output_tokens, tier, model), ex.output_tokens or ex.text_events)
                tpot = ex.tpot
                if tpot is not None:
                    self.observe((self.tpot, tier, model), tpot)
                met = (ttft <= ex.slo.ttft_s and (tpot or 0.0) <= ex.slo.tpot_s
                       and not ex.midstream_error)  # fmt: skip
                label = slo_class(ex.slo.tpot_s)
                self.add((self.slo_met if met else self.slo_missed, tier, label))
        if ex.variant is not None:
            self.record_variant(ex, elapsed)
        if ex.limited and ex.tenant is not None:  # a named key (gateway.pipeline.limits)
            self.add((self.tenant_requests, ex.tenant.name, str(ex.status)))
            if ex.usage_tokens:
                self.add((self.tenant_tokens, ex.tenant.name), ex.usage_tokens)
        if log.isEnabledFor(logging.INFO):
            d = ex.decision
            fields = {
                "request_id": ex.id, "model": model, "policy": d.policy, "reason": d.reason,
                "tier": tier, "backend": b.url if b else None, "status": ex.status,
                "attempts": ex.attempts, "ms": round(elapsed * 1000, 2)}  # fmt: skip
            if d.affinity:  # what prefix affinity did, where it was asked
                fields["affinity"] = d.affinity
            log.info("request", extra={"fields": fields})

    def declare_variants(self, variants: Iterable[tuple[str, str]]) -> None:
        """Gray releases' request series at 0 for every (release, variant), mode and outcome:
        a series born at its first event has no earlier sample, so rate() would miss that
        event, and an error ratio would have no series to show until the first error."""
        for release, variant in variants:
            for mode in ("live", "shadow"):
                for outcome in ("ok", "client_error", "error"):
                    self.child(self.release_requests, release, variant, mode, outcome)

    def declare_tenants(self, limited: Iterable[tuple[str, Iterable[str]]]) -> None:
        """Each limited tenant's refusal series at 0, by the limits it has (as for variants)."""
        for tenant, limits in limited:
            for limit in limits:
                self.child(self.rate_limited, tenant, limit)

    def record_variant(self, ex: Exchange, elapsed: float) -> None:
        """A gray release's request (live or shadow), once it is over."""
        v = ex.variant
        assert v is not None
        mode = "shadow" if ex.shadow else "live"
        if ex.midstream_error or ex.status >= 500 or ex.status == 0:
            outcome = "error"
        else:
            outcome = "client_error" if ex.status >= 400 else "ok"
        self.add((self.release_requests, v.release, v.name, mode, outcome))
        if ex.backend is not None:
            self.observe((self.release_duration, v.release, v.name, mode), elapsed)
            if ex.ttft is not None:
                self.observe((self.release_ttft, v.release, v.name, mode), ex.ttft)


def _observe_counted(child: Any, counts: list[float]) -> None:
    """Observations counted by bucket (`Telemetry.observe`: per bucket, then their sum), added
    to a prometheus_client histogram child as its observe() adds each one: to its sum and to
    the one bucket value each falls in (the library keeps them per bucket and sums them up to
    each bound as /metrics is written). Its private values: no public call adds more than one
    observation; tests/unit/test_telemetry.py holds this to observe()'s exposition."""
    child._sum.inc(counts[-1])
    for i, n in enumerate(counts[:-1]):
        if n:
            child._buckets[i].inc(n)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            base += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return base


def setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if as_json
        else KeyValueFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
