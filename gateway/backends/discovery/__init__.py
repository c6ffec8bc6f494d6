"""Discovery: the backends of a tier found while the gateway runs, from DNS (dns.py), the
Kubernetes API (kubernetes.py) or a file (file.py), each address a backend made from the tier's
template.

Each discovering tier runs its source in a task of its own. What a source finds joins the
registry (out of rotation until the monitor's first good probe); what it no longer finds leaves
it (no new requests at once, streams may finish for `drain_s`, then they are cut and continue
elsewhere; the backend is forgotten once idle). A source that fails, or finds nothing, leaves
the tier as it was: the failure is logged and counted, never an empty tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gateway.backends.discovery.source import Found, Source
from gateway.backends.registry import Registry
from gateway.config.settings import DiscoveryConfig, Settings, TierConfig
from gateway.observe.telemetry import Telemetry
from gateway.routing import Role

__all__ = ["Discovery", "Found", "Source", "make_source"]

log = logging.getLogger(__name__)


def make_source(cfg: DiscoveryConfig) -> Source:
    """The source a tier's configuration names (its client library loaded only then)."""
    if cfg.dns is not None:
        from gateway.backends.discovery.dns import DnsSource

        return DnsSource(cfg.dns)
    if cfg.file is not None:
        from gateway.backends.discovery.file import FileSource

        return FileSource(cfg.file)
    assert cfg.kubernetes is not None
    from gateway.backends.discovery.kubernetes import KubernetesSource

    return KubernetesSource(cfg.kubernetes)


class Discovery:
    """The discovering tiers' sources, their answers applied to the registry."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        telemetry: Telemetry,
        sources: Callable[[DiscoveryConfig], Source] = make_source,
    ) -> None:
        self.registry, self.telemetry = registry, telemetry
        self.tiers: list[tuple[TierConfig, DiscoveryConfig, Source]] = [
            (t, t.discovery, sources(t.discovery)) for t in settings.tiers if t.discovery
        ]
        # Per tier: the URLs its source found last (the listed backends are never touched).
        self.found: dict[str, frozenset[str]] = {t.name: frozenset() for t, _, _ in self.tiers}
        self._failing: dict[str, str] = {}  # tier -> the error logged for its current streak
        self._tasks: list[asyncio.Task[None]] = []
        for tier, cfg, _ in self.tiers:
            telemetry.child(telemetry.discovered, tier.name).set(0)
            for outcome in ("ok", "error"):
                telemetry.child(telemetry.discovery_answers, tier.name, cfg.source, outcome)

    async def start(self, first_within_s: float = 5.0) -> None:
        """Run every source; wait (up to `first_within_s`) for each one's first answer, so that
        a gateway starts with its discovered backends known (they join unprobed: the monitor's
        first round decides)."""
        firsts = []
        for tier, cfg, source in self.tiers:
            first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            firsts.append(first)
            self._tasks.append(asyncio.create_task(self._run(tier, cfg, source, first),
                                                   name=f"discovery-{tier.name}"))  # fmt: skip
        if firsts:
            await asyncio.wait(firsts, timeout=first_within_s)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, _, source in self.tiers:
            with contextlib.suppress(Exception):
                await source.aclose()

    async def _run(
        self, tier: TierConfig, cfg: DiscoveryConfig, source: Source, first: asyncio.Future[None]
    ) -> None:
        drain = asyncio.create_task(self._drain(cfg.drain_s))
        try:
            async for found in source.answers():
                try:
                    self.apply(tier, cfg, found)
                except Exception:  # discovery must outlive any one bad answer
                    log.exception("discovery answer not applied", extra={"fields": {
                        "tier": tier.name}})  # fmt: skip
                if not first.done():
                    first.set_result(None)
        finally:
            drain.cancel()
            if not first.done():
                first.set_result(None)

    async def _drain(self, drain_s: float) -> None:
        """Cut what still streams on backends that left more than `drain_s` ago; close the
        own transports (Triton's gRPC channels) of those forgotten since."""
        while True:
            await asyncio.sleep(max(0.05, min(drain_s, 1.0) / 4))
            self.registry.cut_left(drain_s)
            while self.registry.closing:
                with contextlib.suppress(Exception):
                    await self.registry.closing.pop().aclose()

    def apply(self, tier: TierConfig, cfg: DiscoveryConfig, found: Found) -> None:
        """One answer of `tier`'s source: backends found join, backends not found leave. An
        error, or no backend at all, changes nothing (a tier is never emptied by its source)."""
        t = self.telemetry
        why = found.error or ("found no backend" if not found.urls else None)
        if why is not None:
            t.child(t.discovery_answers, tier.name, cfg.source, "error").inc()
            level = logging.DEBUG if self._failing.get(tier.name) == why else logging.WARNING
            self._failing[tier.name] = why
            log.log(level, "discovery failed: the tier keeps its backends", extra={"fields": {
                "tier": tier.name, "source": cfg.source, "error": why,
                "backends": len(self.found[tier.name])}})  # fmt: skip
            return
        t.child(t.discovery_answers, tier.name, cfg.source, "ok").inc()
        if self._failing.pop(tier.name, None) is not None:
            log.info("discovery answers again", extra={"fields": {"tier": tier.name}})
        before = self.found[tier.name]
        listed = {b.url for b in tier.backends}
        role = Role(tier.role)
        # (One that left and is found again while its streams finish comes back at once.)
        for url in sorted(found.urls - before - listed):
            self.registry.join(tier.name, role, cfg.backend.at(url))
        for url in sorted(before - found.urls - listed):
            self.registry.leave(url)
        self.found[tier.name] = frozenset(found.urls - listed)
        t.child(t.discovered, tier.name).set(len(self.found[tier.name]))
