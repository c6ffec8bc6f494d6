"""What a discovery source gives: answers, each the backends found or why there is none."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from gateway.config.settings import url_host

__all__ = ["Found", "Source", "url_of"]


@dataclass(frozen=True, slots=True)
class Found:
    """One answer of a source: the backends' base URLs, or why there is none."""

    urls: frozenset[str] = frozenset()
    error: str | None = None


class Source(Protocol):
    """Where a tier's backends are found: an endless stream of answers, one per resolution or
    change; a failure is an answer too (`Found.error`), never an exception."""

    def answers(self) -> AsyncIterator[Found]: ...

    async def aclose(self) -> None: ...


def url_of(scheme: str, host: str, port: int) -> str:
    """A backend's base URL (IPv6 addresses in brackets)."""
    return f"{scheme}://{url_host(host)}:{port}"
