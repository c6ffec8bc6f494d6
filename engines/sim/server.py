"""The simulator's HTTP face: vLLM's OpenAI-compatible server, field for field.

Endpoints, JSON and SSE framing, error shapes and metric names follow vLLM (V1); what happens
inside is the scheduler of engines.sim.scheduler running in real time (engines.sim.engine).
Beside vLLM's endpoints, the simulator's own controls: /sim/faults and the `x-sim-fault` header
(fault injection), /sim/speculative and the `x-sim-acceptance` header (the speculative acceptance
vector, the workload's side of speculative decoding); engines.sim.faults documents both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engines.front.schemas import ChatCompletionRequest, CompletionRequest
from engines.front.wire import ApiError, collect, parse_body, sse, warm_up
from engines.sim import tokens
from engines.sim.engine import AsyncEngine, engine_metrics
from engines.sim.faults import FaultRequest, Faults
from engines.sim.prefix import block_hashes
from engines.sim.profile import Profile, Speculative, mean_tokens_per_step
from engines.sim.scheduler import Sequence

log = logging.getLogger(__name__)
VERSION = "0.1.0+tiergate.sim"
M = TypeVar("M", bound=BaseModel)


@dataclass
class SimConfig:
    profile: Profile
    served_models: list[str] = field(default_factory=list)
    api_key: str | None = None
    speedup: float = 1.0
    seed: int = 0
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        if not self.served_models:
            self.served_models = [self.profile.model]


@dataclass(slots=True)
class Job:
    """One admitted request: everything needed to produce its reply."""

    rid: str
    model: str
    created: int
    prompt_tokens: int
    plan: tokens.Plan
    seed: int
    fault: FaultRequest
    received: float
    acceptance: tuple[float, ...] | None = None  # from x-sim-acceptance; None: the engine's
    block_hashes: tuple[int, ...] = ()  # prompt + planned output's, for prefix caching
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied, once scheduled
    generated: int = 0  # output tokens so far
    priority: int = 0  # vLLM's `priority` (priority scheduling)


class SpeculativeUpdate(BaseModel):
    """The body of POST /sim/speculative: a new acceptance vector, or a scale of the vector the
    simulator started with (one of the two)."""

    model_config = ConfigDict(extra="forbid")

    acceptance: list[Annotated[float, Field(ge=0, le=1)]] | None = None
    scale: float | None = Field(None, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_of(self) -> SpeculativeUpdate:
        if (self.acceptance is None) == (self.scale is None):
            raise ValueError('send either "acceptance" (one probability per draft) or "scale"')
        return self


def _reason(e: ValueError) -> str:
    if isinstance(e, ValidationError):
        return str(e.errors()[0]["msg"]).removeprefix("Value error, ")
    return str(e)


class HasHeaders(Protocol):
    """What admission reads of a request: its headers (HTTP's, or gRPC's metadata)."""

    @property
    def headers(self) -> Mapping[str, str]: ...


class Simulator:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.metrics = engine_metrics(cfg.profile, cfg.served_models[0])
        self.engine = AsyncEngine(cfg.profile, self.metrics, speedup=cfg.speedup, seed=cfg.seed)
        self.rng = random.Random(cfg.seed)
        self.requests_seen = 0
        # Requests generating now, and the most at once so far (GET /sim/concurrency): what a
        # gateway's concurrency limit must hold to, seen from the engine.
        self.generating = 0
        self.peak_generating = 0

    # -- request intake -----------------------------------------------------------------------
    async def parse(self, request: Request, schema: type[M]) -> M:
        return await parse_body(request, schema)

    def model_for(self, requested: str | None) -> str:
        if requested is None:
            return self.cfg.served_models[0]
        if requested not in self.cfg.served_models:
            raise ApiError(404, f"The model `{requested}` does not exist.", "model")
        return requested

    def admit(
        self,
        request: HasHeaders,
        body: CompletionRequest | ChatCompletionRequest,
        prompt_tokens: int,
        max_tokens: int | None,
        prefix: str,
    ) -> Job:
        received = self.engine.now()
        model = self.model_for(body.model)
        if body.n != 1:
            raise ApiError(400, "The simulator serves n=1 only.", "n")
        limit = self.cfg.profile.max_model_len
        if prompt_tokens >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, "
                f"your request has {prompt_tokens} input tokens.",
                "prompt",
            )
        if max_tokens is None:
            max_tokens = limit - prompt_tokens
        if prompt_tokens + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.",
                "max_tokens",
            )
        if body.min_tokens > max_tokens:
            raise ApiError(400, "min_tokens must be less than or equal to max_tokens", "min_tokens")
        if not self.engine.sched.fits(prompt_tokens):
            raise ApiError(400, "The prompt does not fit the KV cache.", "prompt")
        if body.priority and self.cfg.profile.scheduling_policy != "priority":
            raise ApiError(400, "Got priority " f"{body.priority} but Priority scheduling is not "
                           "enabled.", "priority")  # fmt: skip
        acceptance = self.request_acceptance(request.headers.get("x-sim-acceptance"))
        fault = self.cfg.faults.for_request(request.headers.get("x-sim-fault"), self.rng)
        seed = body.seed or 0
        plan = tokens.plan_output(
            seed=seed,
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            ignore_eos=body.ignore_eos,
            stop=body.stops,
            natural=tokens.natural_length(
                f"{seed}:{prompt_tokens}:{request.headers.get('x-request-id', '')}",
                self.cfg.profile.natural_tokens_mean,
            ),
        )
        self.requests_seen += 1
        return Job(
            rid=f"{prefix}-{body.request_id or uuid.uuid4().hex}",
            model=model,
            created=int(time.time()),
            prompt_tokens=prompt_tokens,
            plan=plan,
            seed=seed,
            fault=fault,
            received=received,
            acceptance=acceptance,
            priority=body.priority,
        )

    def prefix_hashes(self, job: Job, prompt: list[str] | list[int]) -> tuple[int, ...]:
        """The block hashes of `prompt` followed by the job's planned output, for the prefix
        cache (none when it is off). The output counts as the words a later prompt that repeats
        the reply would hold; after a token-id prompt no later prompt (ids) matches them, but
        they still take cache room, as vLLM's cached output blocks do."""
        profile = self.cfg.profile
        if not profile.enable_prefix_caching:
            return ()
        output = tokens.output_tokens(job.seed, job.plan.tokens)
        return block_hashes([*prompt, *output], profile.block_size)

    # -- speculative acceptance ---------------------------------------------------------------
    def speculative(self) -> Speculative:
        """The drafter as the simulator started (profile, or --acceptance); 400 without one."""
        spec = self.cfg.profile.speculative
        if spec is None:
            raise ApiError(400, "This engine does not use speculative decoding.")
        return spec

    def acceptance_state(self) -> dict[str, Any]:
        acceptance = self.engine.sched.acceptance
        return {
            "acceptance": list(acceptance),
            "num_speculative_tokens": self.speculative().num_speculative_tokens,
            "mean_tokens_per_step": mean_tokens_per_step(acceptance),
        }

    def set_acceptance(self, update: SpeculativeUpdate) -> None:
        """Replace the acceptance of every sequence without its own, from the next step on."""
        spec = self.speculative()
        try:
            if update.scale is not None:
                spec = spec.scaled(update.scale)
            else:
                spec = spec.with_acceptance(update.acceptance or ())
        except ValueError as e:
            raise ApiError(400, _reason(e), "acceptance") from None
        self.engine.sched.acceptance = spec.acceptance
        log.info("speculative acceptance now %s", list(spec.acceptance))

    def request_acceptance(self, header: str | None) -> tuple[float, ...] | None:
        """The x-sim-acceptance header: k comma-separated probabilities, or one scale factor."""
        if header is None:
            return None
        try:
            return self.speculative().parse(header).acceptance
        except ValueError as e:
            raise ApiError(400, f"x-sim-acceptance: {_reason(e)}") from None
        except ApiError as e:
            raise ApiError(400, f"x-sim-acceptance: {e.message}") from None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The engine's loop, for an app's lifespan (frozen from the start with the hang fault)."""
        self.engine.start()
        if self.cfg.faults.hang:
            self.engine.freeze()
        try:
            yield
        finally:
            await self.engine.stop()

    # -- generation ---------------------------------------------------------------------------
    async def pieces(
        self, job: Job, on_start: Callable[[], None] | None = None
    ) -> AsyncGenerator[tuple[str, bool], None]:
        """The reply's text, one piece per engine step that advanced it, and whether it is the
        last piece. `on_start` is called when the request is handed to the engine (after the
        fault delays), which the Triton face reports as the end of its queueing."""
        self.generating += 1
        self.peak_generating = max(self.peak_generating, self.generating)
        try:
            fault = job.fault
            if fault.crash:
                log.warning("crash fault: exiting")
                os._exit(3)
            if fault.error:
                status = self.cfg.faults.error_status
                raise ApiError(
                    status, f"Simulated engine failure, HTTP {status} (fault injection)."
                )
            if fault.hang:
                await asyncio.Event().wait()
            if fault.slow_first_token_s:
                await asyncio.sleep(fault.slow_first_token_s)
            done = 0
            plan = job.plan
            if on_start is not None:
                on_start()
            # Its arrival is set by the engine, after the front end's delay.
            seq = Sequence(job.rid, job.prompt_tokens, plan.tokens, job.received,
                           acceptance=job.acceptance, block_hashes=job.block_hashes,
                           priority=job.priority)  # fmt: skip
            async for n in self.engine.generate(seq, job.received, plan.finish_reason):
                job.cached_tokens = seq.cached_tokens
                start, done = done, done + n
                job.generated = done
                last = done >= plan.tokens
                if last and plan.stop_reason:
                    visible = tokens.visible_text(job.seed, plan.tokens, plan.stop_reason)
                    yield visible[len(tokens.text_of(job.seed, 0, start)) :], True
                else:
                    yield tokens.text_of(job.seed, start, done), last
                if fault.error_after_first and not last:
                    raise ApiError(500, "Simulated engine failure mid-stream (fault injection).")
            self.after_request()
        finally:
            self.generating -= 1

    def after_request(self) -> None:
        crash_after = self.cfg.faults.crash_after
        if crash_after is not None and self.requests_seen >= crash_after:
            log.warning("crash_after=%d reached: exiting", crash_after)
            os._exit(3)

    def usage(self, job: Job, so_far: bool = False) -> dict[str, Any]:
        """The request's usage: its whole answer's, or (`so_far`) the tokens generated up to
        now, as vLLM's `continuous_usage_stats` counts them in each chunk."""
        n = job.generated if so_far else job.plan.tokens
        out: dict[str, Any] = {"prompt_tokens": job.prompt_tokens, "completion_tokens": n,
                               "total_tokens": job.prompt_tokens + n}  # fmt: skip
        if job.cached_tokens:
            # As vLLM with --enable-prompt-tokens-details: only when the cache supplied some.
            out["prompt_tokens_details"] = {"cached_tokens": job.cached_tokens}
        return out


async def _stream(
    sim: Simulator,
    job: Job,
    body: CompletionRequest | ChatCompletionRequest,
    chunk: Callable[[str, str | None], dict[str, Any]],
    first: dict[str, Any] | None,
) -> AsyncIterator[bytes]:
    opts = body.stream_options
    include_usage = bool(opts and opts.include_usage)
    # As vLLM's should_include_usage: continuous usage only along with the final usage chunk.
    continuous = include_usage and bool(opts and opts.continuous_usage_stats)
    try:
        if first is not None:
            if continuous:  # vLLM's chat role chunk: nothing generated yet
                first = {**first, "usage": sim.usage(job, so_far=True)}
            yield sse(first)
        async for text, last in sim.pieces(job):
            # As in vLLM, the chunk that carries the last text also carries the finish reason.
            payload = chunk(text, job.plan.finish_reason if last else None)
            if continuous:
                payload["usage"] = sim.usage(job, so_far=True)
            yield sse(payload)
        if include_usage:
            yield sse({**chunk("", None), "choices": [], "usage": sim.usage(job)})
    except ApiError as e:
        sim.metrics.success["error"].inc()
        yield sse(e.body())
    yield b"data: [DONE]\n\n"


def create_app(cfg: SimConfig) -> Starlette:
    sim = Simulator(cfg)

    def handler(
        fn: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            if (
                cfg.api_key
                and request.url.path.startswith("/v1")
                and request.headers.get("authorization") != f"Bearer {cfg.api_key}"
            ):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            try:
                return await fn(request)
            except ApiError as e:
                if e.status >= 500:
                    sim.metrics.success["error"].inc()
                return e.response()

        return wrapped

    async def completions(request: Request) -> Response:
        body = await sim.parse(request, CompletionRequest)
        prompt = _completion_prompt(body.prompt)
        job = sim.admit(request, body, tokens.count_prompt(prompt), body.max_tokens, "cmpl")
        job.block_hashes = sim.prefix_hashes(job, tokens.prompt_tokens(prompt))

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            stop_reason = job.plan.stop_reason if finish else None
            return {"id": job.rid, "object": "text_completion", "created": job.created,
                    "model": job.model, "choices": [{"index": 0, "text": text, "logprobs": None,
                    "finish_reason": finish, "stop_reason": stop_reason}]}  # fmt: skip

        if body.stream:
            return StreamingResponse(_stream(sim, job, body, chunk, None),
                                     media_type="text/event-stream")  # fmt: skip
        text = "".join(piece for piece, _ in await collect(sim.pieces(job), request))
        out = chunk(text, job.plan.finish_reason)
        out["usage"] = sim.usage(job)
        return JSONResponse(out)

    async def chat(request: Request) -> Response:
        body = await sim.parse(request, ChatCompletionRequest)
        n_prompt = tokens.count_chat([m.text() for m in body.messages])
        job = sim.admit(request, body, n_prompt, body.max_completion_tokens or body.max_tokens,
                        "chatcmpl")  # fmt: skip
        job.block_hashes = sim.prefix_hashes(
            job, tokens.chat_tokens([(m.role, m.text()) for m in body.messages])
        )

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            stop_reason = job.plan.stop_reason if finish else None
            delta = {"content": text} if text or not finish else {}
            return {"id": job.rid, "object": "chat.completion.chunk", "created": job.created,
                    "model": job.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                    "finish_reason": finish, "stop_reason": stop_reason}]}  # fmt: skip

        if body.stream:
            first = chunk("", None)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            return StreamingResponse(_stream(sim, job, body, chunk, first),
                                     media_type="text/event-stream")  # fmt: skip
        text = "".join(piece for piece, _ in await collect(sim.pieces(job), request))
        return JSONResponse({
            "id": job.rid, "object": "chat.completion", "created": job.created, "model": job.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                         "tool_calls": []}, "logprobs": None,
                         "finish_reason": job.plan.finish_reason,
                         "stop_reason": job.plan.stop_reason}],
            "usage": sim.usage(job),
        })  # fmt: skip

    async def models(request: Request) -> Response:
        now = int(time.time())
        data = [{"id": m, "object": "model", "created": now, "owned_by": "vllm", "root": m,
                 "parent": None, "max_model_len": cfg.profile.max_model_len}
                for m in cfg.served_models]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        return Response(status_code=503 if cfg.faults.unhealthy else 200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VERSION})

    async def load(request: Request) -> Response:
        return JSONResponse({"server_load": sim.engine.load})

    async def concurrency(request: Request) -> Response:
        return JSONResponse({"generating": sim.generating, "peak": sim.peak_generating})

    async def metrics(request: Request) -> Response:
        # As vLLM's page (prometheus_client's ASGI app) does: only the samples a scraper names
        # in `name[]`, where it names some. (Text format always, uncompressed.)
        registry: Any = sim.metrics.registry
        names = request.query_params.getlist("name[]")
        if names:
            registry = registry.restricted_registry(names)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def faults(request: Request) -> Response:
        """Inspect or change the fault settings of a running simulator (chaos tests)."""
        if request.method == "POST":
            try:
                changes = json.loads(await request.body())
            except json.JSONDecodeError as e:
                raise ApiError(400, f"Invalid JSON body: {e}") from None
            cfg.faults = merge_faults(cfg.faults, changes)
            if cfg.faults.hang:
                sim.engine.freeze()
        return JSONResponse(cfg.faults.model_dump())

    async def speculative(request: Request) -> Response:
        """The speculative acceptance vector, read (GET) or replaced (POST), for every sequence
        without its own from the next engine step on. GET answers
        {"acceptance": [k floats], "num_speculative_tokens": k, "mean_tokens_per_step": x}.
        POST takes {"acceptance": [k floats, each 0..1]} or {"scale": s} (s >= 0: every
        probability of the vector the simulator started with times s, clamped to 1) and answers
        as GET. 400 in vLLM's error shape for anything else, and on an engine that does not
        speculate."""
        sim.speculative()
        if request.method == "POST":
            sim.set_acceptance(await sim.parse(request, SpeculativeUpdate))
        return JSONResponse(sim.acceptance_state())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await warm_up()
        async with sim.running():
            yield

    routes = [
        Route("/v1/completions", handler(completions), methods=["POST"]),
        Route("/v1/chat/completions", handler(chat), methods=["POST"]),
        Route("/v1/models", handler(models)),
        Route("/health", health),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/version", version),
        Route("/load", load),
        Route("/sim/concurrency", concurrency),
        Route("/metrics", metrics),
        Route("/sim/faults", handler(faults), methods=["GET", "POST"]),
        Route("/sim/speculative", handler(speculative), methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sim = sim
    return app


def _completion_prompt(prompt: str | list[str] | list[int] | list[list[int]]) -> str | list[int]:
    """The one prompt of a completion request: text, or token ids."""
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise ApiError(400, "prompt must not be empty", "prompt")
    if all(isinstance(t, int) for t in prompt):
        return prompt  # type: ignore[return-value]
    if len(prompt) != 1:
        raise ApiError(400, "The simulator serves one prompt per request.", "prompt")
    return prompt[0]  # type: ignore[return-value]


def merge_faults(current: Faults, changes: Any) -> Faults:
    if not isinstance(changes, dict):
        raise ApiError(400, "Send a JSON object of fault settings.")
    try:
        return Faults.model_validate({**current.model_dump(), **changes})
    except ValidationError as e:
        raise ApiError(400, str(e.errors()[0]["msg"])) from None
