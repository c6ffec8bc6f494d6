"""Discovery from a file over real sockets: a gateway whose pool is the file's list of
simulators takes a new engine once the file names it and stops sending to one the file drops,
while streaming clients keep going with no request failed or cut."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtests.harness.procs import GatewayProcess, SimProcess, start_all
from loadtests.harness.stack import MODEL
from tests.integration.stack import wait_until_async

BODY: dict[str, Any] = {"model": MODEL, "prompt": "one two three", "max_tokens": 24,
                        "ignore_eos": True, "stream": True}  # fmt: skip


def write(path: Path, urls: list[str]) -> None:
    """The whole list, renamed over the old file (a reader never sees half of it)."""
    new = path.with_suffix(".new")
    new.write_text(yaml.safe_dump(urls))
    new.replace(path)


async def in_rotation(gw: str) -> set[str]:
    async with httpx.AsyncClient(timeout=10) as c:
        state = (await c.get(gw + "/state")).json()
    return {b["url"] for b in state["backends"]
            if b["tier"] == "pool" and b["healthy"] and not b["left"]}  # fmt: skip


async def test_the_pool_follows_the_file_with_no_request_lost(tmp_path: Path) -> None:
    listing = tmp_path / "pool.yaml"
    a, b = (SimProcess(profile="v3", args=["--speedup", "10"]) for _ in range(2))
    with contextlib.ExitStack() as stack:
        start_all(stack, a, b)
        write(listing, [a.url])
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "tiers": [{"name": "pool", "role": "throughput", "discovery": {
                "file": {"path": str(listing), "interval_s": 0.1},
                "backend": {"models": [MODEL]}, "drain_s": 5}}],
            "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5}}))  # fmt: skip
        gateway = GatewayProcess(config=config, log=tmp_path / "gateway.log")
        start_all(stack, gateway)
        gw = gateway.url
        await wait_until_async(lambda: in_rotation(gw), "the file's engine in rotation")

        seen: list[tuple[float, str]] = []  # (when the request was sent, the engine that answered)
        failed: list[str] = []
        now = asyncio.get_running_loop().time
        stop = asyncio.Event()

        async def client() -> None:
            async with httpx.AsyncClient(timeout=30) as c:
                while not stop.is_set():
                    sent = now()
                    r = await c.post(gw + "/v1/completions", json=BODY)
                    if r.status_code != 200 or not r.text.endswith("data: [DONE]\n\n") or (
                            '"error"' in r.text):  # fmt: skip
                        failed.append(f"{r.status_code} {r.text[-200:]!r}")
                    else:
                        seen.append((sent, r.headers["x-tiergate-backend"]))

        clients = [asyncio.create_task(client()) for _ in range(6)]
        try:
            assert await in_rotation(gw) == {a.url}
            write(listing, [a.url, b.url])
            answered = lambda: {u for _, u in seen}  # noqa: E731
            await wait_until_async(lambda: b.url in answered(), "the new engine answering")
            write(listing, [b.url])
            await wait_until_async(lambda: _async_eq(in_rotation(gw), {b.url}),
                                   "the dropped engine out of rotation")  # fmt: skip
            # Nothing sent once the dropped engine is out of rotation goes to it.
            left = now()
            later = lambda: [u for t, u in seen if t > left]  # noqa: E731
            await wait_until_async(lambda: len(later()) >= 12, "more requests answered")
            assert set(later()) == {b.url}
        finally:
            stop.set()
            await asyncio.gather(*clients)
        assert failed == []
        assert a.url in answered()


async def _async_eq(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
