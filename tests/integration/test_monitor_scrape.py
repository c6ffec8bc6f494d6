"""The load monitor over a real socket: an engine that answers its metrics late counted the
streams it held when asked, not those left when its answer came. A batch of the gateway's own
streams that ended meanwhile must not be read as another gateway's load (it made a backend look
saturated with nothing on it, and conversations left their caches). An engine with no metrics
page stays in rotation; one whose metrics fail is taken out."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from gateway.backends.monitor import Monitor
from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.observe.telemetry import Telemetry
from gateway.wire.vllm.metrics import SERIES
from tests.conftest import free_port

MODEL = "m"
HELD = 25


class LateEngine:
    """Reports HELD streams running, answering /metrics only once `release` is set."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def metrics(self, _: web.Request) -> web.Response:
        self.asked.set()
        await self.release.wait()
        return web.Response(text=(
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{MODEL}"}} {HELD}.0\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{MODEL}"}} 0.0\n'
        ))  # fmt: skip

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", _ok)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="")


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` served on a free loopback port: its runner (to clean up) and its URL."""
    port = free_port()
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _scraped(backend: dict[str, object], rounds: int = 3) -> Registry:
    """A registry of one throughput backend after the monitor's `rounds` scrapes of it."""
    settings = Settings(tiers=[{"name": "pool", "role": "throughput", "backends": [backend]}])
    registry = Registry(settings, MemoryInflightStore(), Telemetry())
    async with aiohttp.ClientSession() as session:
        monitor = Monitor(registry, settings.monitor, session, Telemetry())
        for _ in range(rounds):
            await monitor.refresh()
    return registry


async def test_our_streams_that_ended_during_a_late_scrape_are_not_counted_as_others() -> None:
    engine = LateEngine()
    runner = await engine.start()
    settings = Settings(tiers=[{"name": "awq", "role": "throughput",
                                "backends": [{"url": engine.url, "models": [MODEL]}]}])  # fmt: skip
    registry = Registry(settings, MemoryInflightStore(), Telemetry())
    try:
        async with aiohttp.ClientSession() as session:
            monitor = Monitor(registry, settings.monitor, session, Telemetry())
            for _ in range(HELD):  # the gateway's streams there when the engine is asked
                registry.store.acquire(engine.url)
            scrape = asyncio.create_task(monitor.refresh())
            await asyncio.wait_for(engine.asked.wait(), 10)
            for _ in range(HELD):  # all of them end before the answer comes back
                registry.store.release(engine.url)
            engine.release.set()
            await asyncio.wait_for(scrape, 10)
        load = registry.snapshot().load(engine.url)
        assert (load.running, load.inflight) == (HELD, 0)
        assert load.effective == 0  # the engine's 25 were ours, and they are over
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("status", "ejected"), [(404, False), (501, False), (500, True)])
async def test_an_engine_without_a_metrics_page_stays_in_rotation(
    status: int, ejected: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """SGLang without `--enable-metrics` answers /metrics with 404, llama.cpp's server without
    `--metrics` with 501: healthy engines, served on the gateway's own counts (a warning, once).
    A metrics page that fails (500) is an unwell engine, out of rotation at once."""
    app = web.Application()
    app.router.add_get("/health", _ok)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(status=status, text="not here")

    app.router.add_get("/metrics", metrics)
    runner, url = await _serve(app)
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.backends.monitor"):
            registry = await _scraped({"url": url, "models": [MODEL]})
        entry = registry.entries[url]
        assert entry.live.ejected is ejected
        warned = [r for r in caplog.records if "no metrics page" in r.getMessage()]
        assert len(warned) == (0 if ejected else 1)
        if not ejected:
            registry.store.acquire(url)  # the gateway's own count is the load
            assert registry.snapshot().load(url).effective == 1
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("health_path", "ejected"), [(None, True), ("/", False)])
async def test_an_engine_without_health_at_the_kinds_path_names_its_own(
    health_path: str | None, ejected: bool
) -> None:
    """An engine with no /health (Ollama's answers 200 at /, and has no metrics page) is out of
    rotation by the kind's default, in rotation once its backend names the path it answers."""
    app = web.Application()
    app.router.add_get("/", _ok)
    runner, url = await _serve(app)
    try:
        registry = await _scraped({"url": url, "models": [MODEL], "health_path": health_path})
        assert registry.entries[url].live.ejected is ejected
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("refusal", [None, 400, 404])
async def test_the_metrics_page_is_asked_for_what_is_read_or_else_whole(
    refusal: int | None,
) -> None:
    """A vLLM kind of engine is asked for only the series the gateway reads (`name[]`, which
    prometheus_client's page takes). One that answers that query with a client error is asked
    for the whole page, then and from then on, and its load is read from it all the same."""
    asked: list[list[str]] = []
    app = web.Application()
    app.router.add_get("/health", _ok)

    async def metrics(request: web.Request) -> web.Response:
        names = request.query.getall("name[]", [])
        asked.append(names)
        if names and refusal is not None:
            return web.Response(status=refusal, text="no such query here")
        return web.Response(text=f'vllm:num_requests_running{{model_name="{MODEL}"}} 3.0\n')

    app.router.add_get("/metrics", metrics)
    runner, url = await _serve(app)
    try:
        registry = await _scraped({"url": url, "models": [MODEL]})
        assert registry.snapshot().load(url).running == 3
        assert not registry.entries[url].live.ejected
        if refusal is None:
            assert asked == [list(SERIES)] * 3
        else:  # the query once, then the whole page every time
            assert asked == [list(SERIES), [], [], []]
    finally:
        await runner.cleanup()
