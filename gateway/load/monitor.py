"""Live load: scrape every backend's metrics and health, and eject the ones that fail.

The monitor keeps, per backend, the last good scrape (running, waiting, KV usage), its age, and
why the backend is out of rotation if it is. `snapshot()` merges that with the in-flight counts
of the state store, the freshest signal there is, into the immutable view routing decides on.

A backend is ejected after `eject_after_failures` consecutive failed scrapes or failed requests,
when /health answers non-200, or when it has work but its generated-token counter has not moved
for `stall_after_s` (an engine that still answers /health and /metrics but produces nothing).
Ejected backends are probed every `probe_interval_s` and come back after one good probe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from gateway.load.parse import (
    EngineStats,
    MetricsParseError,
    parse_triton_metrics,
    parse_vllm_metrics,
)
from gateway.routing import Backend, BackendLoad, LoadSnapshot
from gateway.settings import BackendConfig, MonitorConfig
from gateway.state import InflightStore
from gateway.telemetry import Telemetry

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class BackendStatus:
    backend: Backend
    config: BackendConfig
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    spec_acceptance: float | None = None
    scraped_at: float | None = None
    scrape_failures: int = 0
    request_failures: int = 0
    ejected: bool = False
    eject_reason: str = ""
    next_probe: float = 0.0
    progress: float | None = None
    progress_at: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    health_url: str = ""
    metrics_url: str = ""

    @property
    def url(self) -> str:
        return self.backend.url


def merge(stats: Mapping[str, EngineStats]) -> tuple[int, int, float, float | None, float | None]:
    """Running, waiting, KV usage, spec acceptance and progress over the models of one engine."""
    running = int(sum(s.running for s in stats.values()))
    waiting = int(sum(s.waiting for s in stats.values()))
    kv = max((s.kv_usage for s in stats.values() if s.kv_usage is not None), default=0.0)
    acc = [a for s in stats.values() if (a := s.spec_acceptance_rate) is not None]
    gen = [g for s in stats.values() if (g := s.generation_tokens) is not None]
    return running, waiting, kv, (sum(acc) / len(acc) if acc else None), (sum(gen) if gen else None)


class Monitor:
    def __init__(
        self,
        backends: Sequence[tuple[Backend, BackendConfig]],
        cfg: MonitorConfig,
        session: aiohttp.ClientSession,
        store: InflightStore,
        telemetry: Telemetry,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.session = session
        self.store = store
        self.telemetry = telemetry
        self.clock = clock
        self.status: dict[str, BackendStatus] = {}
        for b, c in backends:
            # Triton answers health at /v2/health/ready (400 when not ready) and serves
            # metrics on a port of its own, which metrics_url names.
            health = "/v2/health/ready" if c.kind == "triton" else "/health"
            st = BackendStatus(b, c, health_url=b.url + health, metrics_url=c.scrape_url)
            if c.api_key is not None:
                st.headers["Authorization"] = f"Bearer {c.api_key.get_secret_value()}"
            self.status[b.url] = st
        self.backends = tuple(b for b, _ in backends)
        self.on_eject: list[Callable[[str], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stale_after = 3 * cfg.scrape_interval_s
        self._timeout = aiohttp.ClientTimeout(total=cfg.scrape_timeout_s)

    # -- the view routing reads -----------------------------------------------------------
    def snapshot(self) -> LoadSnapshot:
        now = self.clock()
        counts = self.store.counts()
        loads = {
            url: BackendLoad(
                running=st.running,
                waiting=st.waiting,
                kv_usage=st.kv_usage,
                inflight=counts.get(url, 0),
                healthy=not st.ejected,
                stale=st.scraped_at is None or now - st.scraped_at > self._stale_after,
            )
            for url, st in self.status.items()
        }
        return LoadSnapshot(self.backends, loads, now)

    def healthy_models(self) -> set[str]:
        return {m for st in self.status.values() if not st.ejected for m in st.backend.models}

    # -- what requests report -------------------------------------------------------------
    def request_failed(self, url: str, reason: str) -> None:
        st = self.status[url]
        st.request_failures += 1
        if st.request_failures >= self.cfg.eject_after_failures and not st.ejected:
            self._eject(st, f"requests_{reason}")

    def request_succeeded(self, url: str) -> None:
        self.status[url].request_failures = 0

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-monitor")

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.scrape_interval_s)
            try:
                await self.refresh()
            except Exception:  # the monitor must outlive any one bad round
                log.exception("load monitor round failed")

    async def refresh(self) -> None:
        """One round: scrape every backend due (all healthy ones; ejected ones when probed)."""
        now = self.clock()
        due = [st for st in self.status.values() if not st.ejected or now >= st.next_probe]
        await asyncio.gather(*(self._scrape(st, now) for st in due))
        self._publish(now)

    async def _scrape(self, st: BackendStatus, now: float) -> None:
        probing = st.ejected
        try:
            if probing or now >= st.next_probe:
                async with self.session.get(
                    st.health_url, headers=st.headers, timeout=self._timeout
                ) as r:
                    await r.read()
                    if r.status != 200:
                        raise _Unhealthy(f"health {r.status}")
                st.next_probe = now + self.cfg.probe_interval_s
            async with self.session.get(
                st.metrics_url, headers=st.headers, timeout=self._timeout
            ) as r:
                if r.status != 200:
                    raise _Unhealthy(f"metrics {r.status}")
                text = await r.text()
            parse = parse_triton_metrics if st.config.kind == "triton" else parse_vllm_metrics
            stats = parse(text)
        except _Unhealthy as e:
            self._failed(st, str(e), now, hard=True)
            return
        except (aiohttp.ClientError, TimeoutError, MetricsParseError, UnicodeDecodeError) as e:
            self._failed(st, type(e).__name__, now, hard=False)
            return
        st.running, st.waiting, st.kv_usage, st.spec_acceptance, progress = merge(stats)
        st.scraped_at = self.clock()
        st.scrape_failures = 0
        stalled = self._stalled(st, progress, now)
        if probing:
            if stalled:
                st.next_probe = now + self.cfg.probe_interval_s
                return
            st.ejected, st.request_failures = False, 0
            log.info("backend back in rotation", extra={"fields": {"backend": st.url}})
        elif stalled:
            self._eject(st, "stalled")

    def _stalled(self, st: BackendStatus, progress: float | None, now: float) -> bool:
        if progress is None:
            return False
        busy = st.running + st.waiting > 0 or self.store.local_counts().get(st.url, 0) > 0
        if progress != st.progress or not busy:
            st.progress, st.progress_at = progress, now
            return False
        return now - st.progress_at >= self.cfg.stall_after_s

    def _failed(self, st: BackendStatus, why: str, now: float, *, hard: bool) -> None:
        st.scrape_failures += 1
        st.next_probe = now + self.cfg.probe_interval_s
        if not st.ejected and (hard or st.scrape_failures >= self.cfg.eject_after_failures):
            self._eject(st, f"scrape_{why}")

    def _eject(self, st: BackendStatus, reason: str) -> None:
        st.ejected, st.eject_reason = True, reason
        st.next_probe = self.clock() + self.cfg.probe_interval_s
        b = st.backend
        self.telemetry.ejections.labels(b.role.value, b.url, reason.split("_")[0]).inc()
        log.warning("backend ejected", extra={"fields": {"backend": b.url, "reason": reason}})
        for callback in self.on_eject:
            callback(st.url)

    def _publish(self, now: float) -> None:
        t = self.telemetry
        for st in self.status.values():
            b = st.backend
            t.backend_up.labels(b.role.value, b.url).set(0 if st.ejected else 1)
            t.backend_queue.labels(b.role.value, b.url, "running").set(st.running)
            t.backend_queue.labels(b.role.value, b.url, "waiting").set(st.waiting)
            t.backend_kv.labels(b.role.value, b.url).set(st.kv_usage)
            if st.spec_acceptance is not None:
                t.backend_spec_acceptance.labels(b.role.value, b.url).set(st.spec_acceptance)
            if st.scraped_at is not None:
                t.backend_scrape_age.labels(b.role.value, b.url).set(now - st.scraped_at)


class _Unhealthy(Exception):
    pass
