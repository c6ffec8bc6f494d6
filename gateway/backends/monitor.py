"""Live load: scrape every backend's metrics and health into the registry, and take the ones
that fail out of rotation.

Every `scrape_interval_s` the monitor reads each backend's metrics page (through its wire
adapter's parser) and, every `probe_interval_s`, its health endpoint. A backend is ejected after
`eject_after_failures` consecutive failed scrapes, at once when its health check answers
non-200, and when it has work but its generated-token counter has not moved for `stall_after_s`
(an engine that still answers /health and /metrics but produces nothing). Backends down are
probed every `probe_interval_s` and come back after one good probe that shows no stall.
An engine that serves no metrics page at all (404, 405 or 501 there: SGLang without
`--enable-metrics`, llama.cpp's server without `--metrics`) stays in rotation while its health
check passes, its load known from the gateway's own requests and timings, as for an engine whose
page names nothing the adapter reads; a warning says so once.
Backends ejected for their requests' outcomes (gateway.backends.outlier) are still scraped, and
come back through probation, not a probe: each round moves those whose ejection ran out. A
backend whose kind has a readiness check of its own is probed by it (Triton's: the server and
its models, through tritonclient) instead of a GET of the adapter's health path.

The I/O (`_fetch`) and the bookkeeping (`observe`, a pure function of the result and the time)
are apart, so the rules are tested on a virtual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from gateway.backends.registry import BackendEntry, Registry
from gateway.config.settings import MonitorConfig
from gateway.observe.telemetry import Telemetry
from gateway.wire import Readiness
from gateway.wire.metrics import EngineStats, MetricsParseError

__all__ = ["Monitor", "ScrapeFailed", "merge"]

log = logging.getLogger(__name__)

# A metrics URL that the engine does not serve: not an unwell engine.
_NO_METRICS_PAGE = frozenset({404, 405, 501})


class ScrapeFailed(Exception):
    """A scrape that did not produce load figures. `hard`: the backend said it is unwell (a
    non-200 health answer, a metrics answer other than 200 or "no such page"), which ejects at
    once; otherwise (timeouts, refused connections, an unparsable page) only repeated failures
    do."""

    def __init__(self, why: str, *, hard: bool) -> None:
        super().__init__(why)
        self.why, self.hard = why, hard


@dataclass(slots=True)
class _Watch:
    """The monitor's own bookkeeping for one backend."""

    next_probe: float = 0.0  # when health is checked next
    scrape_failures: int = 0
    progress: float | None = None  # the generated-token counter, last time it moved
    progress_at: float = 0.0


def merge(stats: Mapping[str, EngineStats]) -> tuple[int, int, float, float | None, float | None]:
    """Running, waiting, KV usage, spec acceptance and progress over the models of one engine."""
    running = int(sum(s.running for s in stats.values()))
    waiting = int(sum(s.waiting for s in stats.values()))
    kv = max((s.kv_usage for s in stats.values() if s.kv_usage is not None), default=0.0)
    acc = [a for s in stats.values() if (a := s.spec_acceptance_rate) is not None]
    gen = [g for s in stats.values() if (g := s.generation_tokens) is not None]
    return running, waiting, kv, (sum(acc) / len(acc) if acc else None), (sum(gen) if gen else None)


class ScrapeListener(Protocol):
    """Who else learns from each scrape (gateway.backends.learner.Learner: the latency model)."""

    def scraped(
        self, entry: BackendEntry, stats: Mapping[str, EngineStats], now: float
    ) -> None: ...

    def refresh(self) -> None: ...


class Monitor:
    def __init__(
        self,
        registry: Registry,
        cfg: MonitorConfig,
        session: aiohttp.ClientSession,
        telemetry: Telemetry,
        learner: ScrapeListener | None = None,
    ) -> None:
        self.registry, self.cfg, self.session = registry, cfg, session
        # The registry's clock: scrapes are stamped on the clock leases and snapshots use.
        self.telemetry, self.clock, self.learner = telemetry, registry.clock, learner
        self._task: asyncio.Task[None] | None = None
        self._closing: list[Readiness] = []  # of backends forgotten, closed by the next round
        self._timeout = aiohttp.ClientTimeout(total=cfg.scrape_timeout_s)
        self._watch: dict[str, _Watch] = {}
        # Kinds with a readiness check of their own (Triton's, through tritonclient).
        self._ready: dict[str, Readiness] = {}
        self._unmetered: set[str] = set()  # backends warned of as serving no metrics page
        self._whole: set[str] = set()  # backends that refused the query for a part of the page
        self._generation = -1
        self._follow()

    def _follow(self) -> None:
        """Watch the registry's backends as they are now (discovery adds and forgets some)."""
        if self._generation == self.registry.generation:
            return
        self._generation = self.registry.generation
        urls = {e.url for e in self.registry}
        for e in self.registry:
            if e.url not in self._watch:
                self._watch[e.url] = _Watch()
                ready = e.kind.readiness(e, e.own_transport, self.cfg.scrape_timeout_s)
                if ready is not None:
                    self._ready[e.url] = ready
        for url in set(self._watch) - urls:
            del self._watch[url]
            self._whole.discard(url)  # (a backend found again at that address may differ)
            self._unmetered.discard(url)
            if (gone := self._ready.pop(url, None)) is not None:
                self._closing.append(gone)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-monitor")

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for ready in [*self._ready.values(), *self._closing]:
            await ready.aclose()

    async def _run(self) -> None:
        arrived = self.registry.arrived
        while True:
            # A round every interval, or at once when discovery adds a backend.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), self.cfg.scrape_interval_s)
            arrived.clear()
            try:
                await self.refresh()
            except Exception:  # the monitor must outlive any one bad round
                log.exception("load monitor round failed")

    # -- one round -------------------------------------------------------------------------
    def due(self, entry: BackendEntry, now: float) -> bool:
        """Backends up every round; those down when their next probe is due."""
        st = entry.live
        if not st.down or st.eject_reason == "joining":  # a discovered backend: probed at once
            return True
        return now >= max(self._watch[entry.url].next_probe,
                          st.ejected_at + self.cfg.probe_interval_s)  # fmt: skip

    def health_due(self, entry: BackendEntry, now: float) -> bool:
        return entry.live.down or now >= self._watch[entry.url].next_probe

    async def refresh(self) -> None:
        """Scrape every backend due, record what came back, publish it."""
        self._follow()
        while self._closing:
            await self._closing.pop().aclose()
        now = self.clock()
        due = [e for e in self.registry if self.due(e, now)]
        results = await asyncio.gather(*(self._fetch(e, self.health_due(e, now)) for e in due))
        for entry, (result, ours) in zip(due, results, strict=True):
            if self.registry.entries.get(entry.url) is entry:  # not forgotten meanwhile
                self.observe(entry, result, now, ours)
        self.registry.tick()
        self._publish(now)
        if self.learner is not None:
            self.learner.refresh()
        # New load figures may have freed room for requests held by admission.
        self.registry.changed.notify()

    async def _fetch(
        self, entry: BackendEntry, health: bool
    ) -> tuple[Mapping[str, EngineStats] | ScrapeFailed, int | None]:
        """The engine's figures (or why there are none), and how many of the gateway's requests
        it held when it counted them: its gauges are of a moment between the metrics request
        and its answer, taken as the larger of the gateway's in-flight counts at those two
        moments. (The count after alone, on a machine busy enough to answer late, took a batch
        of ours that had ended meanwhile for another gateway's: a backend seen full of requests
        that were all gone.)"""
        auth = entry.auth
        try:
            if health and (ready := self._ready.get(entry.url)) is not None:
                failed = await ready.check()
                if failed is not None:
                    return ScrapeFailed(f"health {failed[0]}", hard=failed[1]), None
            elif health:
                async with self.session.get(
                    entry.health_url, headers=auth, timeout=self._timeout
                ) as r:
                    await r.read()
                    if r.status != 200:
                        return ScrapeFailed(f"health {r.status}", hard=True), None
            before = self.registry.inflight(entry)
            status, text = await self._page(entry)
            if status in _NO_METRICS_PAGE:
                self._unmetered_once(entry, status)
                return {}, max(before, self.registry.inflight(entry))
            if status != 200:
                return ScrapeFailed(f"metrics {status}", hard=True), None
            self._unmetered.discard(entry.url)
            return entry.adapter.parse_metrics(text), max(before, self.registry.inflight(entry))
        except (aiohttp.ClientError, TimeoutError, MetricsParseError, UnicodeDecodeError) as e:
            return ScrapeFailed(type(e).__name__, hard=False), None

    async def _page(self, entry: BackendEntry) -> tuple[int, str]:
        """The status of the engine's metrics page and, where 200, its text: only the series
        its kind reads, where the engine takes the query for them (prometheus_client's page,
        vLLM's, does): its cost on the engine's side and the parse on this side shrink with it.
        An engine that answers the query with a client error is asked for the whole page, then
        and from then on."""
        url, query = entry.metrics_url, entry.adapter.metrics_query
        # Uncompressed: prometheus_client gzips a page for a client that accepts it, and a page
        # of a few KB on a local network costs more CPU compressed, at both ends, than sent.
        headers = {**entry.auth, "accept-encoding": "identity"}
        if query and entry.url not in self._whole:
            status, text = await self._get(f"{url}{'&' if '?' in url else '?'}{query}", headers)
            if not 400 <= status < 500:
                return status, text
            self._whole.add(entry.url)
            log.info("backend refused the query for a part of its metrics page (%d): it is "
                     "asked for the whole page", status,
                     extra={"fields": {"backend": entry.url}})  # fmt: skip
        return await self._get(url, headers)

    async def _get(self, url: str, headers: dict[str, str]) -> tuple[int, str]:
        """The status of a GET of `url` and, where 200, its text (any other body read and
        dropped, so that the connection goes back to the pool)."""
        async with self.session.get(url, headers=headers, timeout=self._timeout) as r:
            if r.status == 200:
                return r.status, await r.text()
            await r.read()
            return r.status, ""

    def _unmetered_once(self, entry: BackendEntry, status: int) -> None:
        if entry.url not in self._unmetered:
            self._unmetered.add(entry.url)
            log.warning(
                "backend serves no metrics page: its load is known from the gateway's own "
                "requests only", extra={"fields": {"backend": entry.url,
                                                    "metrics_url": entry.metrics_url,
                                                    "status": status}})  # fmt: skip

    def observe(
        self,
        entry: BackendEntry,
        result: Mapping[str, EngineStats] | ScrapeFailed,
        now: float,
        ours: int | None = None,
    ) -> None:
        """Record one scrape's result at `now`: load figures, or a failure; eject, re-admit.
        `ours`: the gateway's requests the engine held when it counted (None: as many as are in
        flight now)."""
        if entry.url not in self._watch:  # joined since the last round
            self._follow()
        w, st = self._watch[entry.url], entry.live
        probing = st.down
        if isinstance(result, ScrapeFailed):
            w.scrape_failures += 1
            w.next_probe = now + self.cfg.probe_interval_s
            if result.hard or w.scrape_failures >= self.cfg.eject_after_failures:
                self.registry.eject(entry, f"scrape_{result.why}")
            return
        if probing or now >= w.next_probe:
            w.next_probe = now + self.cfg.probe_interval_s  # health was checked, and fine
        st.running, st.waiting, st.kv_usage, st.spec_acceptance, progress = merge(result)
        st.scraped_at = now
        st.inflight_at_scrape = self.registry.inflight(entry) if ours is None else ours
        w.scrape_failures = 0
        if self.learner is not None:
            self.learner.scraped(entry, result, now)
        stalled = self._stalled(entry, w, progress, now)
        if probing:
            if stalled:
                w.next_probe = now + self.cfg.probe_interval_s
            else:
                self.registry.readmit(entry)
        elif stalled:
            self.registry.eject(entry, "stalled")

    def _stalled(self, entry: BackendEntry, w: _Watch, progress: float | None, now: float) -> bool:
        if progress is None:
            return False
        st = entry.live
        busy = st.running + st.waiting > 0 or self.registry.local_inflight(entry) > 0
        if progress != w.progress or not busy:
            w.progress, w.progress_at = progress, now
            return False
        return now - w.progress_at >= self.cfg.stall_after_s

    def _publish(self, now: float) -> None:
        t = self.telemetry
        for e in self.registry:
            b, st = e.backend, e.live
            role = b.role.value
            t.backend_up.labels(role, b.url).set(0 if st.ejected else 1)
            t.backend_queue.labels(role, b.url, "running").set(st.running)
            t.backend_queue.labels(role, b.url, "waiting").set(st.waiting)
            t.backend_kv.labels(role, b.url).set(st.kv_usage)
            if st.spec_acceptance is not None:
                t.backend_spec_acceptance.labels(role, b.url).set(st.spec_acceptance)
            if st.scraped_at is not None:
                t.backend_scrape_age.labels(role, b.url).set(now - st.scraped_at)
