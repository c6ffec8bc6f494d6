"""The assembly of one gateway: every part built once, each given what it needs when it is
built (no part is wired to another afterwards), then started and, on exit, taken down in
reverse.

`core` builds the parts that decide where requests go (the learner, the load monitor feeding
it, the router) around a registry; `open_gateway` builds those and the request pipeline around
them. The routing study (loadtests.routing_sim.cosim) builds its gateway with the same `core`, so
that what it measures is what the gateway runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from gateway.backends.discovery import Discovery
from gateway.backends.learner import Learner
from gateway.backends.monitor import Monitor
from gateway.backends.registry import Registry
from gateway.backends.state import InflightStore, make_store
from gateway.config.settings import ConfigError, Settings, kind_problems
from gateway.core.errors import GatewayError
from gateway.core.exchange import Exchange
from gateway.core.http1 import Http1Pool
from gateway.observe.telemetry import Telemetry
from gateway.observe.tracing_env import trace_exporters
from gateway.pipeline.admission import Admission, Queueing
from gateway.pipeline.drain import Drain
from gateway.pipeline.homes import Homes
from gateway.pipeline.intake import Intake
from gateway.pipeline.limits import Limits
from gateway.pipeline.releases import Releases
from gateway.pipeline.router import Router
from gateway.pipeline.shadow import Shadow
from gateway.pipeline.upstream import Upstream
from gateway.serve.admin import Control
from gateway.serve.planning import Planning
from gateway.wire import EngineKind
from gateway.wire.kinds import BUILTIN

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from gateway.pipeline.tracing import Tracing

__all__ = ["Core", "Gateway", "Hosting", "core", "open_gateway"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Core:
    """What decides where requests go, around one registry."""

    registry: Registry
    learner: Learner  # the latency model's learning
    monitor: Monitor  # scrapes the engines into the registry (and the learner)
    router: Router  # the policy, applied to the registry's snapshots


def core(settings: Settings, registry: Registry, session: Any, learn: bool = True) -> Core:
    """The learner, the monitor and the router around `registry` (on its clock and
    telemetry). `session`: the monitor's aiohttp session (None where nothing is scraped over
    HTTP: the routing study). `learn` False: the monitor does not feed the learner (a study of
    policies that read no predictions saves the model's work)."""
    learner = Learner(registry, settings, registry.telemetry, registry.clock)
    monitor = Monitor(registry, settings.monitor, session, registry.telemetry,
                      learner if learn else None)  # fmt: skip
    return Core(registry, learner, monitor, Router(settings.policy, registry))


@dataclass(frozen=True, eq=False)
class Gateway:
    """Everything one gateway instance owns, built whole by `open_gateway`."""

    settings: Settings
    telemetry: Telemetry
    store: InflightStore
    registry: Registry
    monitor: Monitor
    router: Router
    learner: Learner
    intake: Intake
    admission: Admission
    upstream: Upstream
    drain: Drain
    control: Control  # run-time changes: gray releases' weights, config reload
    limits: Limits  # tenants' rate limits
    shadow: Shadow  # gray releases' shadow copies
    tracing: Tracing | None = None  # None: tracing off (no OTEL_* settings)
    discovery: Discovery | None = None  # None: no tier discovers its backends
    # Where each affinity key was served last (None: prefix affinity off).
    homes: Homes | None = None
    # The demand per SLO class and the replicas each tier needs (None: planner off).
    planning: Planning | None = None

    async def reject(self, ex: Exchange, e: GatewayError) -> None:
        """Answer `ex` with the gateway's own error."""
        self.telemetry.child(self.telemetry.rejected, e.reason).inc()
        ex.status = e.status
        headers = [(b"content-type", b"application/json"), *ex.response_headers, *e.headers]
        await ex.answer(e.status, headers, e.body())


@dataclass(frozen=True)
class Hosting:
    """What the host hands a gateway besides its settings (each optional)."""

    # The shutdown state its runner shares (a new one if none).
    drain: Drain | None = None
    # The in-flight counts (`make_store(settings.redis_url)` if none; a worker of several
    # passes its view of the table the workers share).
    store: InflightStore | None = None
    # Where spans go (the caller's to shut down), else the one the OTEL_* environment asks
    # for, if any.
    tracer_provider: TracerProvider | None = None
    # How a worker of several hands admin changes to the others.
    publish: Callable[[bytes], None] | None = None
    # The engine kinds backends may name.
    kinds: Mapping[str, EngineKind] = field(default_factory=lambda: BUILTIN)


@asynccontextmanager
async def open_gateway(
    settings: Settings, hosting: Hosting | None = None
) -> AsyncIterator[Gateway]:
    """Build the gateway, start its background work (state sync, load monitor), and take it
    all down again on exit. Raises ConfigError where a backend's kind or options do not fit
    `hosting.kinds`."""
    hosting = hosting or Hosting()
    problems = kind_problems(settings.tiers, hosting.kinds)
    if problems:
        raise ConfigError("invalid configuration:\n" + "\n".join(f"  {p}" for p in problems),
                          problems=problems)  # fmt: skip
    drain, store, tracer_provider = hosting.drain, hosting.store, hosting.tracer_provider
    publish = hosting.publish
    async with AsyncExitStack() as stack:
        telemetry = Telemetry()
        tracing: Tracing | None = None
        if tracer_provider is not None or trace_exporters(os.environ):
            # OpenTelemetry is imported only when tracing is on.
            from gateway.pipeline.tracing import Tracing, provider_from_env

            if tracer_provider is None and (own := provider_from_env(os.environ)) is not None:
                stack.callback(own.shutdown)  # flushes the spans still queued
                tracer_provider = own
        if store is None:
            store = make_store(settings.redis_url)
        connector = aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=300, enable_cleanup_closed=True,
            keepalive_timeout=settings.upstream_keepalive_s,
        )  # fmt: skip
        session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        stack.push_async_callback(session.close)
        # Requests to the engines go through the gateway's own client (gateway.core.http1); the
        # aiohttp session above is the monitor's, for scrapes and probes.
        pool = Http1Pool(
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.request_timeout_s,
            keepalive_s=settings.upstream_keepalive_s,
        )
        stack.push_async_callback(pool.aclose)
        await store.start()
        stack.push_async_callback(store.aclose)
        registry = Registry(settings, store, telemetry, kinds=hosting.kinds)
        parts = core(settings, registry, session)
        learner, monitor, router = parts.learner, parts.monitor, parts.router
        if tracer_provider is not None:
            tracing = Tracing(tracer_provider, registry)
        releases = Releases(settings.releases)
        upstream = Upstream(pool, registry, telemetry, settings, learner)
        displace = registry.displace if settings.priorities and settings.tenants else None
        joining = registry.joining if any(t.discovery for t in settings.tiers) else None
        queueing = Queueing(settings.policy.queue_deadline_s, settings.priorities, displace,
                            joining)  # fmt: skip
        intake = Intake(settings, registry, releases)
        gw = Gateway(
            settings=settings,
            telemetry=telemetry,
            store=store,
            registry=registry,
            monitor=monitor,
            router=router,
            learner=learner,
            intake=intake,
            admission=Admission(router.decide, registry.changed, queueing, telemetry),
            upstream=upstream,
            drain=drain or Drain(),
            control=Control(settings, releases, frozenset(registry.models), telemetry, publish),
            shadow=Shadow(router.decide, upstream, telemetry),
            limits=Limits(
                settings.redis_url if settings.tenants else None, telemetry, settings.tenants
            ),
            tracing=tracing,
            discovery=Discovery(settings, registry, telemetry) if any(
                t.discovery for t in settings.tiers) else None,
            homes=intake.homes,
            planning=Planning(settings.planner, list(settings.tiers), registry, telemetry)
            if settings.planner.enabled and settings.tiers else None,
        )
        if displace is not None:
            for e in registry:  # its series at 0 (see Telemetry.declare_variants)
                telemetry.child(telemetry.displaced, e.backend.role.value, e.url)
        stack.push_async_callback(gw.upstream.aclose)
        if gw.discovery is not None:  # found before the monitor's first round probes them
            await gw.discovery.start()
            stack.push_async_callback(gw.discovery.aclose)
        await monitor.start()
        stack.push_async_callback(monitor.aclose)
        await gw.upstream.watchdog.start()
        stack.push_async_callback(gw.upstream.watchdog.aclose)
        stack.push_async_callback(gw.shadow.aclose)
        await gw.limits.start()
        stack.push_async_callback(gw.limits.aclose)
        if gw.planning is not None:
            await gw.planning.start()
            stack.push_async_callback(gw.planning.aclose)
        state = store.kind
        log.info("gateway ready", extra={"fields": {
            "backends": len(registry.backends), "models": ",".join(sorted(registry.models)),
            "policy": router.name, "state": state,
            "releases": ",".join(sorted(releases.table)) or "none",
            "tracing": "off" if gw.tracing is None else "on"}})  # fmt: skip
        yield gw


