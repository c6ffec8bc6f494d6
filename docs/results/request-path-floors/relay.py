"""The least an HTTP/1.1 relay in Python can do per request (uvloop, httptools): each request's
bytes, as the client sent them, to a pooled keep-alive connection to the engine, and the
engine's answer back, bytes as they come, its end found by parsing. No routing, no checks, no
metrics: the floor the gateway's own work is measured above (floors.py).

    python relay.py ENGINE_HOST ENGINE_PORT PORT
"""

from __future__ import annotations

import asyncio
import sys

import httptools
import uvloop


class Engine(asyncio.Protocol):
    """A pooled connection to the engine, relaying one answer at a time to `client`."""

    def __init__(self, pool: list[Engine]) -> None:
        self.pool = pool
        self.client: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)

    def data_received(self, data: bytes) -> None:
        if self.client is not None:
            self.client.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.client = None
        self.pool.append(self)


class Client(asyncio.Protocol):
    def __init__(self, host: str, port: int, pool: list[Engine]) -> None:
        self.host, self.port, self.pool = host, port, pool
        self.parser = httptools.HttpRequestParser(self)
        self.request: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.request.append(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        request, self.request = b"".join(self.request), []
        asyncio.get_running_loop().create_task(self.forward(request))

    async def forward(self, request: bytes) -> None:
        if self.pool:
            engine = self.pool.pop()
        else:
            loop = asyncio.get_running_loop()
            _, engine = await loop.create_connection(lambda: Engine(self.pool), self.host,
                                                     self.port)  # fmt: skip
        engine.client = self.transport
        assert engine.transport is not None
        engine.transport.write(request)


async def main(host: str, port: int, listen: int) -> None:
    pool: list[Engine] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(host, port, pool), "127.0.0.1", listen)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
