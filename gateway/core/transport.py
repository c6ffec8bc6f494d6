"""What pipeline.upstream needs of a way to reach an engine: `post` a request, read the answer.

gateway.core.http1 is the transport of every backend but those whose kind brings its own
(Triton's gRPC stream, gateway.wire.triton.grpc_transport), whose answers read as the same bytes,
so one relay serves both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from multidict import CIMultiDictProxy

__all__ = ["Transport", "UpstreamResponse"]


class UpstreamResponse(Protocol):
    """An engine's answer: aiohttp's exception types for failures (core.http1 says which)."""

    status: int
    headers: CIMultiDictProxy[str]

    @property
    def content(self) -> UpstreamResponse: ...

    async def readany(self) -> bytes: ...

    async def read(self) -> bytes: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    async def post(
        self, base: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> UpstreamResponse: ...
