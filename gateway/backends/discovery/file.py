"""Backends listed in a file that something else writes (an orchestrator's hook, a script,
`tiergate up --autoscale`): YAML or JSON, a list of base URLs (`["http://10.0.0.5:8000"]`) or a
mapping with one (`{backends: [...]}`), re-read every `interval_s`. Write it whole and rename it
over the old one, so that a reader never sees half of it; a file that is missing, unreadable or
malformed is a failed answer, and the tier keeps the backends it had (as for DNS)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.backends.discovery.source import Found
from gateway.config.settings import FileDiscovery

__all__ = ["FileSource", "parse"]


def parse(text: str) -> frozenset[str]:
    """The backends' base URLs a file's text lists; ValueError naming what is wrong."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML or JSON: {e}") from None
    if isinstance(data, dict):
        data = data.get("backends")
    if data is None:
        return frozenset()
    if not isinstance(data, list):
        raise ValueError("expected a list of URLs, or a mapping with `backends:` listing them")
    urls = set()
    for item in data:
        if not isinstance(item, str):
            raise ValueError(f"not a URL: {item!r}")
        parts = urlsplit(item.strip())
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise ValueError(f"not an http(s)://host:port URL: {item!r}")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError(f"a base URL has no path, query or fragment: {item!r}")
        urls.add(f"{parts.scheme}://{parts.netloc}")
    return frozenset(urls)


class FileSource:
    def __init__(self, cfg: FileDiscovery) -> None:
        self.cfg = cfg

    async def answers(self) -> AsyncIterator[Found]:
        path, every = self.cfg.path, self.cfg.interval_s
        while True:
            try:
                # A small file, read whole: off the event loop all the same (a network disk).
                text = await asyncio.to_thread(path.read_text, encoding="utf-8")
                yield Found(parse(text))
            except (OSError, UnicodeDecodeError, ValueError) as e:
                yield Found(error=f"{path}: {type(e).__name__}: {e}")
            await asyncio.sleep(every)

    async def aclose(self) -> None:
        return None
