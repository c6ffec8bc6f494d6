"""Engine profiles: the cost model of one simulated engine, as data (profiles/*.yaml).

A step of the engine processes D decode tokens (1 per running sequence, or k+1 when it verifies k
speculative drafts) and P prompt tokens of the sequences prefilled in that step. Its duration is a
roofline on the decode side: a fixed part (reading the weights, plus the draft passes when
speculating), a per-token part (KV reads, sampling), and a steeper per-token part past the ridge,
where the batch turns compute-bound; prompt tokens are compute-bound already and cost a flat
`prefill_per_token_s` each (about 0.1 ms for a 7B model on an A100):

    step = base_s + per_token_s * D + over_ridge_s * max(0, D - ridge_tokens)
           + prefill_per_token_s * P + [prefill_base_s if P > 0]

`frontend_s` (+ `frontend_per_running_s` x running) is per-request latency spent outside the engine
loop (HTTP, tokenisation, the API server's queue): it delays the request's arrival at the scheduler
but does not block the batch. See profiles/README.md for how each profile was fitted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

PROFILE_DIR = Path(__file__).parent / "profiles"


def mean_tokens_per_step(acceptance: Iterable[float]) -> float:
    """Expected tokens one sequence emits per verification step (1 + accepted drafts), where
    acceptance[i] is the probability of draft i given drafts 0..i-1 were accepted."""
    total, run = 1.0, 1.0
    for a in acceptance:
        run *= a
        total += run
    return total


class Speculative(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = "eagle3"
    num_speculative_tokens: int = Field(5, ge=1, le=16)
    # acceptance[i]: probability that draft i is accepted given drafts 0..i-1 were.
    acceptance: tuple[float, ...]

    @model_validator(mode="after")
    def _check(self) -> Speculative:
        k, n = self.num_speculative_tokens, len(self.acceptance)
        if n != k:
            raise ValueError(f"acceptance needs {k} probabilities (one per draft token), got {n}")
        if not all(0.0 <= a <= 1.0 for a in self.acceptance):
            raise ValueError("acceptance probabilities must be within 0..1")
        return self

    def mean_tokens_per_step(self) -> float:
        """Expected tokens one sequence emits per verification step (1 + accepted drafts)."""
        return mean_tokens_per_step(self.acceptance)

    def with_acceptance(self, acceptance: Iterable[float]) -> Speculative:
        """The same drafter with another acceptance vector, validated (k values, each 0..1);
        raises ValueError (pydantic's ValidationError) otherwise."""
        return Speculative.model_validate({**self.model_dump(), "acceptance": tuple(acceptance)})

    def scaled(self, factor: float) -> Speculative:
        """Every probability times `factor`, clamped to 0..1: the same drafter on a workload it
        predicts better (factor > 1) or worse (< 1)."""
        if not (math.isfinite(factor) and factor >= 0):
            raise ValueError(f"the scale must be a finite number >= 0, got {factor}")
        return self.with_acceptance(min(1.0, a * factor) for a in self.acceptance)

    def parse(self, text: str) -> Speculative:
        """`a0,a1,...,a(k-1)` (the vector itself) or one number (a scale of this vector)."""
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise ValueError(f"not a comma-separated list of numbers: {text!r}") from None
        return self.scaled(values[0]) if len(values) == 1 else self.with_acceptance(values)


class Cost(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_s: float = Field(ge=0)
    per_token_s: float = Field(ge=0)
    prefill_base_s: float = Field(0.0, ge=0)
    prefill_per_token_s: float = Field(0.0, ge=0)
    ridge_tokens: float = Field(1e9, gt=0)
    over_ridge_s: float = Field(0.0, ge=0)
    frontend_s: float = Field(0.0, ge=0)
    frontend_per_running_s: float = Field(0.0, ge=0)

    def step_s(self, decode_tokens: int, prefill_tokens: int) -> float:
        t = self.base_s + self.per_token_s * decode_tokens
        t += self.over_ridge_s * max(0.0, decode_tokens - self.ridge_tokens)
        if prefill_tokens:
            t += self.prefill_base_s + self.prefill_per_token_s * prefill_tokens
        return t

    def frontend_delay_s(self, running: int) -> float:
        return self.frontend_s + self.frontend_per_running_s * running


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    engine: Literal["vllm", "hf"] = "vllm"
    model: str = "meta-llama/Llama-2-7b-chat-hf"
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    max_model_len: int = Field(4096, ge=16)
    block_size: int = Field(16, ge=1)
    num_gpu_blocks: int = Field(2750, ge=1)
    cost: Cost
    speculative: Speculative | None = None
    # Mean natural reply length (tokens) when ignore_eos is off: the simulated EOS.
    natural_tokens_mean: int = Field(160, ge=1)
    # Automatic prefix caching (vLLM V1's default): a prompt's leading blocks already in the KV
    # pool are not prefilled again; the cache lives in the free part of num_gpu_blocks.
    enable_prefix_caching: bool = True
    # vLLM's --scheduling-policy: fcfs, or priority (waiting requests by their `priority`
    # field, lower first, then arrival; a nonzero priority is refused under fcfs, as vLLM does).
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"

    @property
    def serial(self) -> bool:
        """HF generate engines (v0/v1) serve one request at a time."""
        return self.max_num_seqs == 1

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def with_overrides(self, **changes: object) -> Profile:
        """A copy with top-level fields replaced (validated again)."""
        data = self.model_dump()
        data.update({k: v for k, v in changes.items() if v is not None})
        return Profile.model_validate(data)


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """Load a profile by name (a file in profiles/) or by path to a YAML file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(available_profiles())
        raise FileNotFoundError(f"no profile {name_or_path!r} (known: {known})")
    data = yaml.safe_load(path.read_text())
    return Profile.model_validate(data)
