"""The tutorial's v0/v1 behind vLLM's OpenAI API: transformers `generate`, one request at a time.

v0 and v1 are plain Hugging Face generation (v0 the default attention, v1 a fused kernel), batch
1: a request waits until the one before it is done. This server gives them vLLM's outside (the
completions and chat endpoints, streaming or not, `usage`, `[DONE]`, vLLM's error shapes and
metric names), so the gateway and Locust treat them as any other tier. The model runs in a worker
thread; the event loop only moves tokens, so a long generation never blocks other requests'
admission or `/metrics`.

A `Generator` does the model work; `TransformersGenerator` (engines/hf/model.py) is the real one.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engines.front.metrics import EngineMetrics
from engines.front.schemas import ChatCompletionRequest, CompletionRequest
from engines.front.wire import ApiError, collect, parse_body, sse, until_disconnect, warm_up


class Cancelled(Exception):
    """The client went away: the generation stops at its next token."""


class Generator(Protocol):
    """The model behind the server. `generate` runs in a worker thread, one call at a time."""

    max_model_len: int

    def encode(self, text: str) -> list[int]: ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt ids of a conversation (ValueError when the model has no chat template)."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def generate(
        self, prompt: list[int], max_tokens: int, ignore_eos: bool, on_token: Callable[[int], None]
    ) -> str:
        """Greedy generation; `on_token` is called with each new token id (it may raise
        Cancelled to stop). Returns vLLM's finish reason: "length" or "stop"."""
        ...


@dataclass
class HFConfig:
    generator: Generator
    served_model: str
    attn: str = "sdpa"  # shown by /version


@dataclass
class _Job:
    rid: str
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    received: float
    # Filled by the worker thread through the loop: token ids, then None with the reason set.
    queue: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    finish_reason: str = "length"
    cancel: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    generated: int = 0


class Engine:
    """Serial generation with vLLM's queue gauges and request metrics."""

    def __init__(self, cfg: HFConfig) -> None:
        self.gen = cfg.generator
        self.metrics = EngineMetrics(cfg.served_model)
        self.lock = asyncio.Lock()
        self.waiting = 0
        self._releases: set[asyncio.Task[None]] = set()
        # One long-lived thread runs every generation: batch 1, and the framework's per-thread
        # state (CUDA handles, caches) is made once rather than per request.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")

    async def _release(self, worker: asyncio.Future[None], job: _Job, reason: str, n: int,
                       first: float | None, last: float) -> None:  # fmt: skip
        m = self.metrics
        try:
            await worker  # the next request must not overlap this one
        finally:
            m.running.set(0)
            self.lock.release()
        m.success[reason].inc()
        if reason in ("length", "stop"):
            m.e2e.observe(last - job.received)
            if n > 1 and first is not None:
                m.tpot.observe((last - first) / (n - 1))

    def admit(self, prompt: list[int], max_tokens: int | None, ignore_eos: bool) -> _Job:
        limit = self.gen.max_model_len
        if len(prompt) >= limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However,"
                           f" your request has {len(prompt)} input tokens.", "prompt")  # fmt: skip
        if max_tokens is None:
            max_tokens = limit - len(prompt)
        if len(prompt) + max_tokens > limit:
            total = len(prompt) + max_tokens
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However,"
                           f" you requested {total} tokens ({len(prompt)} in the prompt,"
                           f" {max_tokens} in the completion).", "max_tokens")  # fmt: skip
        return _Job(f"{uuid.uuid4().hex}", prompt, max_tokens, ignore_eos, time.monotonic())

    async def tokens(self, job: _Job) -> AsyncIterator[int]:
        """The job's new token ids as the model makes them; waits its turn first."""
        m = self.metrics
        self.waiting += 1
        m.waiting.set(self.waiting)
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
            m.waiting.set(self.waiting)
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        m.queue.observe(started - job.received)
        m.running.set(1)
        m.prompt_tokens.inc(len(job.prompt))

        def on_token(token: int) -> None:
            if job.cancel.is_set():
                raise Cancelled
            loop.call_soon_threadsafe(job.queue.put_nowait, token)

        def work() -> None:
            try:
                job.finish_reason = self.gen.generate(
                    job.prompt, job.max_tokens, job.ignore_eos, on_token
                )
            except Cancelled:
                job.finish_reason = "abort"
            except BaseException as e:  # reported to the request, not lost in the thread
                job.error = e
            loop.call_soon_threadsafe(job.queue.put_nowait, None)

        worker = loop.run_in_executor(self.pool, work)
        n, first, last = 0, None, started
        finished = False
        try:
            while (token := await job.queue.get()) is not None:
                now = time.monotonic()
                if first is None:  # one request at a time: a step is its prompt, then a token
                    first = now
                    m.ttft.observe(now - job.received)
                    m.iteration_tokens.observe(len(job.prompt))
                else:
                    m.itl.observe(now - last)
                    m.iteration_tokens.observe(1)
                last, n = now, n + 1
                job.generated = n
                # Counted as they come, as vLLM does per step: a router that watches this
                # counter to tell a slow engine from a hung one sees it move.
                m.generation_tokens.inc()
                yield token
            finished = True
        finally:
            if not finished:
                job.cancel.set()  # the client left: stop the model at its next token
            # Release the model once the worker is done, in a task of its own: a cancelled
            # request's cleanup can be cancelled again at any await (anyio cancels until the
            # scope exits), and must not leave the model locked.
            reason = "abort" if not finished else ("error" if job.error else job.finish_reason)
            done = loop.create_task(self._release(worker, job, reason, n, first, last))
            self._releases.add(done)
            done.add_done_callback(self._releases.discard)
        if job.error is not None:
            raise ApiError(500, f"Generation failed: {job.error}")

    async def pieces(self, job: _Job) -> AsyncIterator[tuple[str, bool]]:
        """The reply's text as it grows: each piece is what the latest token added once decoded
        with all the ones before it (a token can be part of a character or a word)."""
        ids: list[int] = []
        sent = ""
        async for token in self.tokens(job):
            ids.append(token)
            text = self.gen.decode(ids)
            # Hold back a trailing replacement character: the next token completes it.
            if text.endswith("\ufffd"):
                continue
            if len(text) > len(sent):
                yield text[len(sent) :], False
                sent = text
        text = self.gen.decode(ids)
        yield text[len(sent) :], True

    def usage(self, job: _Job, completion: int) -> dict[str, int]:
        return {"prompt_tokens": len(job.prompt), "completion_tokens": completion,
                "total_tokens": len(job.prompt) + completion}  # fmt: skip


def create_app(cfg: HFConfig) -> Starlette:
    engine = Engine(cfg)
    gen = cfg.generator

    def model_for(requested: str | None) -> str:
        if requested is not None and requested != cfg.served_model:
            raise ApiError(404, f"The model `{requested}` does not exist.", "model")
        return cfg.served_model

    async def respond(
        request: Request,
        job: _Job,
        body: CompletionRequest | ChatCompletionRequest,
        chunk: Callable[[str, str | None], dict[str, Any]],
        whole: Callable[[str, str, dict[str, int]], dict[str, Any]],
        first: dict[str, Any] | None,
    ) -> Response:
        if body.stream:
            opts = body.stream_options
            usage = opts is not None and bool(opts.include_usage)

            async def events() -> AsyncIterator[bytes]:
                # A client that hangs up stops the model at its next token, without waiting
                # for a failed write or for the garbage collector to close this generator.
                watch = asyncio.ensure_future(until_disconnect(request))
                watch.add_done_callback(lambda _: job.cancel.set())
                try:
                    if first is not None:
                        yield sse(first)
                    try:
                        async for text, last in engine.pieces(job):
                            yield sse(chunk(text, job.finish_reason if last else None))
                    except ApiError as e:
                        yield sse(e.body())
                    else:
                        if usage:
                            done = {**chunk("", None), "choices": []}
                            done["usage"] = engine.usage(job, job.generated)
                            yield sse(done)
                    yield b"data: [DONE]\n\n"
                finally:
                    watch.cancel()

            return StreamingResponse(events(), media_type="text/event-stream")
        pieces = await collect(engine.pieces(job), request)
        text = "".join(p for p, _ in pieces)
        return JSONResponse(whole(text, job.finish_reason, engine.usage(job, job.generated)))

    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        model = model_for(body.model)
        if body.n != 1:
            raise ApiError(400, "This engine serves n=1 only.", "n")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            ids = [int(t) for t in prompt]
        elif isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1
                                         and isinstance(prompt[0], str)):  # fmt: skip
            ids = gen.encode(prompt if isinstance(prompt, str) else str(prompt[0]))
        else:
            raise ApiError(400, "This engine takes one prompt per request.", "prompt")
        job = engine.admit(ids, body.max_tokens, body.ignore_eos)
        rid, created = f"cmpl-{job.rid}", int(time.time())

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            return {"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": finish, "stop_reason": None}]}  # fmt: skip

        def whole(text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
            return {**chunk(text, finish), "usage": usage}

        return await respond(request, job, body, chunk, whole, None)

    async def chat(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        model = model_for(body.model)
        if body.n != 1:
            raise ApiError(400, "This engine serves n=1 only.", "n")
        try:
            ids = gen.chat_prompt([{"role": m.role, "content": m.text()} for m in body.messages])
        except ValueError as e:
            raise ApiError(400, str(e), "messages") from None
        job = engine.admit(ids, body.max_completion_tokens or body.max_tokens, body.ignore_eos)
        rid, created = f"chatcmpl-{job.rid}", int(time.time())

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            delta = {"content": text} if text or not finish else {}
            return {"id": rid, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                 "finish_reason": finish}]}  # fmt: skip

        def whole(text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
            return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "logprobs": None, "finish_reason": finish}],
                    "usage": usage}  # fmt: skip

        first = chunk("", None)
        first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return await respond(request, job, body, chunk, whole, first)

    def handler(
        fn: Callable[[Request], Any],
    ) -> Callable[[Request], Any]:
        async def wrapped(request: Request) -> Response:
            try:
                resp: Response = await fn(request)
                return resp
            except ApiError as e:
                return e.response()

        return wrapped

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": cfg.served_model, "object": "model", "created": 0, "owned_by": "tiergate",
             "max_model_len": gen.max_model_len}]})  # fmt: skip

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": f"tiergate-hf (transformers generate, {cfg.attn})"})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await warm_up()
        yield
        engine.pool.shutdown(wait=False, cancel_futures=True)

    return Starlette(lifespan=lifespan, routes=[
        Route("/v1/completions", handler(completions), methods=["POST"]),
        Route("/v1/chat/completions", handler(chat), methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/version", version),
        Route("/metrics", metrics),
    ])  # fmt: skip
