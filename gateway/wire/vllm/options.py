"""The options of a backend of kind vllm."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["VllmOptions"]


class VllmOptions(BaseModel):
    """Options of a backend of kind `vllm` (vLLM's OpenAI-compatible server)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # vLLM run with `--scheduling-policy priority`: requests carry vLLM's `priority` field from
    # their tenant's priority (interactive -1, standard 0, batch 1: lower runs first). Leave it
    # off otherwise: vLLM refuses a nonzero priority without priority scheduling.
    priority_scheduling: bool = False
