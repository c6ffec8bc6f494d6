"""The load monitor over a real socket: an engine that answers its metrics late counted the
streams it held when asked, not those left when its answer came. A batch of the gateway's own
streams that ended meanwhile must not be read as another gateway's load (it made a backend look
saturated with nothing on it, and conversations left their caches)."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from gateway.backends.monitor import Monitor
from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.observe.telemetry import Telemetry
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
