"""The gateway's API as pydantic models: what `/openapi.json` and `/docs` publish.

The request models are also what the proxy validates before routing. They type only the fields
the gateway reads; every other field (OpenAI's `temperature`, `stop`, ..., vLLM's `ignore_eos`,
`min_tokens`, `priority`, ...) is allowed, forwarded byte for byte and validated by the engine.
The response models describe what the engines answer (vLLM's OpenAI server), as the gateway
passes it on; the side endpoints' models are what the gateway itself returns.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "REASONING_FIELDS",
    "AffinityView",
    "BackendView",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionRequest",
    "ErrorDetail",
    "ErrorResponse",
    "GatewayState",
    "Health",
    "ModelCard",
    "ModelList",
    "Readiness",
    "StateStoreView",
    "Usage",
]


# -- requests ---------------------------------------------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = Field(
        None, description="The served model name; may be left out when the gateway serves one."
    )
    stream: bool | None = Field(False, description="Answer as server-sent events.")
    stream_options: dict[str, Any] | None = Field(
        None,
        description='With `stream`: `{"include_usage": true}` adds a final chunk with token usage.',
    )
    max_tokens: int | None = Field(None, ge=1, description="Most tokens to generate.")

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Request:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be given when stream is true")
        return self


class CompletionRequest(_Request):
    """`POST /v1/completions`. Other OpenAI and vLLM sampling fields pass through."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": "meta-llama/Llama-2-7b-chat-hf", "prompt": "Hello", "max_tokens": 32}
            ]
        }
    )

    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="Text, texts, token ids, or lists of token ids."
    )


class ChatCompletionRequest(_Request):
    """`POST /v1/chat/completions`. Other OpenAI and vLLM fields pass through."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "meta-llama/Llama-2-7b-chat-hf",
                    "messages": [{"role": "user", "content": "Hello"}],
                    "max_tokens": 32,
                }
            ]
        }
    )

    messages: list[dict[str, Any]] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Most tokens to generate.")


# -- what the engines answer, passed on ---------------------------------------------------------


class _Open(BaseModel):
    # Engines add fields of their own (vLLM: stop_reason, prompt_logprobs, ...): all pass.
    model_config = ConfigDict(extra="allow")


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(_Open):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class Completion(_Open):
    """A completion; as a stream, each event is one of these with the text generated since the
    last (`object: text_completion` too, as vLLM sends), then `data: [DONE]`."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionChunk(Completion):
    """One server-sent event of a streamed completion (`data: {...}`); the stream ends with
    `data: [DONE]`, and an error after the first byte arrives as a `data: {"error": ...}` event
    before it."""


class ChatChoice(_Open):
    index: int
    message: dict[str, Any]
    finish_reason: str | None = None


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


# Where a chat delta carries a reasoning model's reasoning: `reasoning` (vLLM's reasoning
# parsers), `reasoning_content` (older vLLM, DeepSeek's API).
REASONING_FIELDS = ("reasoning", "reasoning_content")


class ChatCompletionChunk(_Open):
    """One server-sent event of a streamed chat completion (`choices[].delta`); the stream ends
    with `data: [DONE]`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage | None = None


# -- what the gateway answers itself ------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="OpenAI's error type, e.g. BadRequestError, RateLimitError.")
    param: str | None = Field(description="The request field at fault, when there is one.")
    code: int = Field(description="The HTTP status.")


class ErrorResponse(BaseModel):
    """Every error the gateway gives itself, and every error vLLM gives, has this shape."""

    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tiergate"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    ready: bool = Field(description="Every model has at least one backend in rotation.")
    models: dict[str, bool]
    state_store: Literal["ok", "degraded"]
    draining: bool = Field(default=False, description="Shutting down: finishing what it has.")


class CurvePoint(BaseModel):
    concurrency: int
    tpot_ms: float = Field(description="Predicted time per output token with this many streams.")
    step_ms: float = Field(description="The engine's step time that TPOT comes from: TPOT x"
                           " tokens per step.")  # fmt: skip
    ttft_ms: float = Field(description="Predicted time to first token of the stream that makes"
                           " it this many.")  # fmt: skip
    evidence: float = Field(description="Observations behind the TPOT value there (0:"
                            " extrapolated past the frontier).")  # fmt: skip


class ModelView(BaseModel):
    """The latency model's view of one backend."""

    frontier: int = Field(description="The most streams observed on the backend: the curve rests"
                          " on observations up to here, continues their slope one stream past"
                          " it, and grows in proportion to the streams further on (0: nothing"
                          " observed yet).")  # fmt: skip
    spread: float = Field(description="Deviation of ln(a request's TPOT) around the curve, as"
                          " the finished streams show it.")  # fmt: skip
    bias: float = Field(description="Mean of ln(a request's TPOT / the curve).")
    curve: list[CurvePoint]
    tokens_per_step: float = Field(description="1 + accepted drafts per verification step,"
                                   " lately (1: no speculative decoding seen).")  # fmt: skip
    acceptance_rate: float | None = Field(description="Accepted / proposed draft tokens, lately.")
    prefill_ms_per_1k_tokens: float = Field(description="What 1,000 prompt tokens prefilled"
                                            " beside the decodes add to a step, as learned from"
                                            " the engine's prompt and prefix-cache counters; the"
                                            " curve is the step without it (0: none learned).")
    prompt_ms_per_1k_tokens: float = Field(description="What 1,000 prompt tokens computed add to"
                                           " a request's prefill, as learned from the engine's"
                                           " prefill times: what a conversation's move there off"
                                           " its prefix cache costs (0: none learned).")
    slo_limit: int = Field(description="The most streams at which the predicted TPOT meets the"
                           " default SLO: for a latency backend, its effective limit.")  # fmt: skip
    observed_ago_s: float | None = Field(description="Seconds since the last observation.")


class BackendView(BaseModel):
    url: str
    tier: str
    role: Literal["latency", "throughput"]
    kind: str = Field(description="The engine's API: vllm, triton.")
    models: list[str]
    running: int = Field(description="Scraped vllm:num_requests_running.")
    waiting: int = Field(description="Scraped vllm:num_requests_waiting.")
    kv_usage: float
    inflight: int = Field(description="Requests in flight through the gateway (all replicas).")
    effective: int = Field(description="The load routing uses.")
    healthy: bool
    stale: bool = Field(description="The last good scrape is too old to trust.")
    ejected_reason: str | None
    probation: bool = Field(
        default=False,
        description="Back after an ejection for its requests' outcomes: it takes one request at"
        " a time until enough of them succeed.",
    )
    model: ModelView | None = Field(default=None, description="The learned latency curve.")
    discovered: bool = Field(
        default=False, description="Found by its tier's discovery (DNS or Kubernetes), not listed.")
    left: bool = Field(
        default=False,
        description="Gone from discovery: it takes no new requests; its streams finish, then it"
        " is forgotten.",
    )


class StateStoreView(BaseModel):
    kind: Literal["memory", "shared", "redis"]
    healthy: bool


class TierPlanView(BaseModel):
    name: str
    current: int = Field(description="Its backends in rotation when the planner last ran.")
    desired: int = Field(description="The replicas the plan asks for.")
    load: float = Field(description="Replicas' worth of the forecast demand planned onto it.")
    capacity_rps: dict[str, float] = Field(
        description="Per SLO class: requests/s one replica completes within the class's SLO,"
        " from its learned curves (0: none within it, or nothing learned yet)."
    )


class PlanView(BaseModel):
    """The planner's last plan (docs/autoscaling.md)."""

    tiers: list[TierPlanView]
    demand_rps: dict[str, float] = Field(
        description="Per SLO class: the arrivals per second planned for (the forecast over a"
        " replica's start-up, with headroom)."
    )
    unmet: list[str] = Field(
        description="Classes no tier serves within their SLO, even at its maximum."
    )
    cost: float = Field(description="The plan's cost: replicas x each tier's cost per replica.")


class AffinityView(BaseModel):
    """Prefix-cache affinity's memory in this process (gateway.pipeline.homes)."""

    keys: int = Field(description="Affinity keys remembered now, each with where it was served.")
    quiet: bool = Field(
        description="Nothing has repeated for `policy.affinity_quiet_after` new keys in a row:"
        " one request in `policy.affinity_quiet_every` is keyed (and what may be a later turn"
        " looked up) until a remembered key comes again."
    )


class GatewayState(BaseModel):
    """What routing sees right now."""

    policy: str
    latency_open: bool = Field(description="golden-range: the latency tier takes new work.")
    slo_ttft_ms: float = Field(description="The default TTFT SLO.")
    slo_tpot_ms: float = Field(description="The default TPOT SLO.")
    state_store: StateStoreView
    backends: list[BackendView]
    pid: int = Field(
        description="The gateway process that answered: one of several with `tiergate serve"
        " --workers N`, each serving the connections the kernel gives it."
    )
    served: int = Field(
        description="Proxied requests this process has completed since it started (/metrics"
        " counts every worker's)."
    )
    plan: PlanView | None = Field(
        default=None, description="The planner's last plan (null: the planner is off)."
    )
    affinity: AffinityView | None = Field(
        default=None,
        description="Prefix-cache affinity's memory (null: affinity is off, or one backend).",
    )


# -- the admin API (gateway.serve.admin)
# --------------------------------------------------------------


class ShadowView(BaseModel):
    variant: str = Field(description="The variant copies go to; their answers are discarded.")
    share: float = Field(gt=0, le=1, description="The share of the other variants' requests "
                         "copied.")  # fmt: skip


class VariantView(BaseModel):
    name: str
    model: str = Field(description="The model name the variant's backends serve.")
    weight: float
    share: float = Field(description="Its weight over the sum of the weights.")


class ReleaseView(BaseModel):
    model: str = Field(description="The model name clients ask for.")
    variants: list[VariantView]
    shadow: ShadowView | None


class ReleaseList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ReleaseView]


class ReleaseUpdate(BaseModel):
    """New weights for some of a release's variants (the others keep theirs) and, when the
    field is present, its shadow mode (null: off)."""

    model_config = ConfigDict(extra="forbid")

    weights: dict[str, Annotated[float, Field(ge=0, le=1e6)]] = {}
    shadow: ShadowView | None = None


class ReloadResult(BaseModel):
    file: str
    releases_changed: list[str] = Field(description="Models whose releases changed.")
    needs_restart: list[str] = Field(
        description="Other sections of the file that differ from what runs: they take effect "
        "at the next start."
    )
