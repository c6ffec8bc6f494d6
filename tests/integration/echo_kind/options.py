"""The echo kind's own backend option."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EchoOptions"]


class EchoOptions(BaseModel):
    """Options of a backend of kind `echo`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Put before every prompt the engine is sent.
    echo_prefix: str = Field(default="", max_length=16)
