"""What the gateway checks in a request body before routing it.

Only the fields routing needs are typed; every other field (vLLM's `ignore_eos`, `min_tokens`,
`priority`, ...) is accepted and, since the original bytes are forwarded, passes through untouched.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Body:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be given when stream is true")
        return self


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] | list[list[int]]


class ChatBody(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI/vLLM error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
