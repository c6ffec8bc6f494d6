"""vLLM's wire format as both engines speak it: the error JSON, request bodies parsed into the
schemas with vLLM's 400s, SSE framing, and replies abandoned when the client goes away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar, TypeVar

import anyio
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P")


class ApiError(Exception):
    TYPES: ClassVar[dict[int, str]] = {
        400: "BadRequestError",
        404: "NotFoundError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict[str, Any]:
        kind = self.TYPES.get(self.status, "BadRequestError")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.status}}  # fmt: skip

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


async def parse_body(request: Request, schema: type[M]) -> M:
    """A JSON body validated by `schema`, or vLLM's 400 naming the field."""
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"Invalid JSON body: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise ApiError(400, f"{param}: {err['msg']}" if param else err["msg"], param) from None


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(pieces: AsyncIterator[P], request: Request) -> list[P]:
    """Every piece of a non-streamed reply, aborting the request if the client goes away."""

    async def run() -> list[P]:
        return [piece async for piece in pieces]

    work = asyncio.ensure_future(run())
    watch = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    return await work


async def warm_up() -> None:
    """What a server's first streamed answer would otherwise pay: Starlette streams in an anyio
    task group, whose event-loop backend anyio imports on first use (~60 ms, more on a busy
    machine), enough for a router to take a fresh engine for a slow one. Called from a
    lifespan, before the engine says it is ready, as a real engine warms up before it serves."""
    async with anyio.create_task_group():
        pass
