"""The echo kind's readiness: GET /alive answers {"alive": true}."""

from __future__ import annotations

import aiohttp

__all__ = ["EchoReadiness"]


class EchoReadiness:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.checks = 0

    async def check(self) -> tuple[str, bool] | None:
        self.checks += 1
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as s, s.get(self.url + "/alive") as r:
                alive = r.status == 200 and (await r.json()).get("alive") is True
        except (aiohttp.ClientError, TimeoutError) as e:
            return type(e).__name__, False
        return None if alive else ("not alive", True)

    async def aclose(self) -> None:
        return None
