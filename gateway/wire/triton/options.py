"""The options of a backend of kind triton."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

__all__ = ["TritonOptions"]

_Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class TritonOptions(BaseModel):
    """Options of a backend of kind `triton` (Triton Inference Server with its vLLM backend)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The model repository's name for a model clients ask for (Triton names cannot contain
    # "/"); a model not listed is asked for under its own name.
    # (Checked even when unset: a model name with "/" needs an entry.)
    triton_models: dict[_Name, _Name] = Field(default={}, validate_default=True)
    # host:port of Triton's gRPC endpoint (8001 by default). Set, requests go through its
    # stream (ModelStreamInfer) instead of the generate API; `url` still names the backend,
    # and health and metadata are read over gRPC too.
    triton_grpc: str | None = None

    @field_validator("triton_grpc")
    @classmethod
    def _check_triton_grpc(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        host, sep, port = value.rpartition(":")
        if not sep or not host or "/" in value:
            raise ValueError("must be host:port (Triton's gRPC endpoint, e.g. triton:8001)")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError("port must be a number between 1 and 65535")
        return value

    @field_validator("triton_models")
    @classmethod
    def _check_triton_models(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        models = (info.context or {}).get("models")
        if models is None:
            return value  # validated alone (no backend at hand): its own shape only
        unknown = sorted(set(value) - set(models))
        if unknown:
            raise ValueError(f"names models not in models: {unknown}")
        for model in models:
            if "/" in value.get(model, model):
                raise ValueError(
                    f"Triton model names cannot contain '/': map {model!r} to the name in the"
                    " model repository"
                )
        return value
