"""The OpenAI error shape, built in one place: `{"error": {message, type, param, code}}`.

Every answer the gateway gives itself (a client's mistake, saturation, no backend, a stream cut
mid-way) uses it; engines' own errors pass through as they are.
"""

from __future__ import annotations

import json
from collections.abc import Container, Mapping, Sequence
from typing import Any

__all__ = ["ERROR_TYPES", "GatewayError", "error_body", "error_json", "first_problem", "sse_error"]

# The `type` OpenAI's clients map to their exception classes.
ERROR_TYPES: dict[int, str] = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    431: "RequestHeaderFieldsTooLargeError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_body(
    status: int, message: str, param: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    """The error object for `status`; `kind` overrides the type its status implies."""
    kind = kind or ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "APIError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_json(
    status: int, message: str, param: str | None = None, kind: str | None = None
) -> bytes:
    return json.dumps(error_body(status, message, param, kind)).encode()


def sse_error(message: str, status: int = 502, kind: str | None = None) -> bytes:
    """The SSE event that ends a stream on an error, as vLLM ends its own (no [DONE] here)."""
    return b"data: " + error_json(status, message, None, kind) + b"\n\n"


class GatewayError(Exception):
    """An answer the gateway gives instead of forwarding: raised anywhere on the request path
    before the first byte, turned into OpenAI error JSON by the app. `reason` labels
    `tiergate_rejected_total`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        *,
        headers: list[tuple[bytes, bytes]] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers or []
        self.reason = reason or f"http_{status}"

    def body(self) -> bytes:
        return error_json(self.status, self.message, self.param)


def first_problem(
    errors: Sequence[Mapping[str, Any]], skip: Container[str] = ()
) -> tuple[str, str | None]:
    """A failed validation's first problem, for a 400: (message, param), the param being the
    field's dotted path, less the parts named in `skip` (e.g. FastAPI's "body")."""
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    param = ".".join(str(p) for p in first.get("loc", ()) if p not in skip) or None
    message = str(first.get("msg", "invalid"))
    return (f"{param}: {message}" if param else message), param
