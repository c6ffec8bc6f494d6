"""`tiergate bench conversations`' two phases with the gateway's defaults, each round twice on
fresh deployments: as the bench runs them (`cold`: after the chats one at a time only the latency
engine has been seen), and with one streamed request of 8 tokens on each pool engine between
the phases (`seen`: two at once, pinned to the pool with `x-tiergate-tier`: an engine nothing
is known of takes one stream), so that every engine has been seen at one stream when the 32
chats start. Per round and arm: the crowd's later turns at home, and first turns per instance.

Usage: python pools-seen.py ROUNDS"""

import asyncio
import sys
import tempfile
from pathlib import Path

import aiohttp

from loadtests import conversations as c
from loadtests.harness.stack import start_stack

OPTS = c.Options()


async def phases(url: str, seen: bool) -> str:
    async with aiohttp.ClientSession() as s:
        for i in range(OPTS.solo):
            await c.converse(s, url, f"solo-{i}", OPTS)
        if seen:

            async def one() -> str:
                body = {"model": c.MODEL, "prompt": "hello", "max_tokens": 8, "stream": True}
                pin = {"x-tiergate-tier": "throughput"}
                async with s.post(f"{url}/v1/completions", json=body, headers=pin) as r:
                    await r.read()
                    return r.headers["x-tiergate-backend"]

            first, second = await asyncio.gather(one(), one())
            assert first != second, "both on one pool engine"
            await asyncio.sleep(0.6)  # two scrapes
        crowd = await asyncio.gather(*(c.converse(s, url, f"crowd-{i}", OPTS)
                                       for i in range(OPTS.crowd)))  # fmt: skip
        m = c.measure(crowd)
        return f"{m['at_home']} {m['later_turns']} {m['first_turns']}"


def main() -> None:
    for r in range(int(sys.argv[1])):
        for seen in (True, False):
            with tempfile.TemporaryDirectory() as d:
                stack = start_stack(Path(d), speedup=1.0, latency=1, throughput=2,
                                    latency_args=("--prefix-caching",),
                                    throughput_args=("--prefix-caching",),
                                    monitor={"scrape_interval_s": 0.25,
                                             "probe_interval_s": 2.0})  # fmt: skip
                try:
                    out = asyncio.run(phases(stack.gateway.url, seen))
                finally:
                    stack.stop()
            print(r, "seen" if seen else "cold", out, flush=True)


if __name__ == "__main__":
    main()
