"""`create_app(settings)`: builds everything the gateway needs and keeps it on the app.

The two proxy endpoints are plain ASGI callables (the hot path: body, validation, routing,
forwarding, telemetry); the rest are ordinary Starlette endpoints.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.load.monitor import Monitor
from gateway.routing import (
    Backend,
    Decision,
    Policy,
    PolicyParams,
    Role,
    RouteRequest,
    RouterState,
    get_policy,
)
from gateway.routing.types import Reason
from gateway.schemas import ChatBody, CompletionBody, error_body
from gateway.settings import Settings
from gateway.state import InflightStore, make_store
from gateway.telemetry import Telemetry
from gateway.triton import Incompatible, incompatibility
from gateway.upstream import Outcome, Upstream

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}


class ClientError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers or []


@dataclass
class Gateway:
    """Everything one gateway instance owns; built by create_app, torn down by its lifespan."""

    settings: Settings
    telemetry: Telemetry
    store: InflightStore
    backends: tuple[Backend, ...]
    models: frozenset[str]
    params: PolicyParams
    policy_name: str
    policy: Policy
    rng: random.Random
    state: RouterState
    session: aiohttp.ClientSession | None = None
    monitor: Monitor | None = None
    upstream: Upstream | None = None
    api_keys: frozenset[bytes] = frozenset()
    # Triton backends' URLs, and the (model, pinned role) pairs a backend of another kind
    # serves: requests Triton's generate API cannot take go elsewhere or get a 400.
    triton: frozenset[str] = frozenset()
    generic: frozenset[tuple[str, Role | None]] = frozenset()
    rid_prefix: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    rid_counter: Iterator[int] = field(default_factory=itertools.count)

    def new_request_id(self) -> str:
        # A per-process random prefix and a counter: unique, and far cheaper than uuid4.
        return f"{self.rid_prefix}{next(self.rid_counter):08x}"

    def decide(self, req: RouteRequest) -> Decision:
        assert self.monitor is not None
        decision = self.policy(req, self.monitor.snapshot(), self.state, self.params, self.rng)
        self.state = decision.state
        return decision


def build_gateway(settings: Settings) -> Gateway:
    backends = tuple(
        Backend(b.url, t.name, Role(t.role), frozenset(b.models))
        for t in settings.tiers
        for b in t.backends
    )
    p = settings.policy
    others = [
        (m, Role(t.role))
        for t in settings.tiers
        for b in t.backends
        if b.kind != "triton"
        for m in b.models
    ]
    return Gateway(
        settings=settings,
        telemetry=Telemetry(),
        store=make_store(settings.redis_url),
        backends=backends,
        models=frozenset(m for b in backends for m in b.models),
        params=PolicyParams(
            latency_max_concurrency=p.latency_max_concurrency,
            hysteresis=p.hysteresis,
            latency_hard_cap=p.latency_hard_cap,
            max_waiting=p.max_waiting,
            p2c_min_pool=p.p2c_min_pool,
        ),
        policy_name=p.name,
        policy=get_policy(p.name),
        rng=random.Random(p.seed),
        state=RouterState(),
        api_keys=frozenset(f"Bearer {k.get_secret_value()}".encode() for k in settings.api_keys),
        triton=frozenset(b.url for t in settings.tiers for b in t.backends if b.kind == "triton"),
        generic=frozenset([*others, *((m, None) for m, _ in others)]),
    )


async def _read_body(receive: Receive, limit: int, declared: int | None) -> bytes:
    if declared is not None and declared > limit:
        raise ClientError(413, f"Request body of {declared} bytes exceeds the {limit}-byte limit.")
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise asyncio.CancelledError
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ClientError(413, f"Request body exceeds the {limit}-byte limit.")
        parts.append(chunk)
        if not msg.get("more_body"):
            return b"".join(parts)


async def _send_json(
    send: Send, status: int, payload: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ProxyEndpoint:
    """POST /v1/completions and /v1/chat/completions."""

    def __init__(self, gw: Gateway, path: str, schema: type[BaseModel]) -> None:
        self.gw, self.path, self.schema = gw, path, schema
        self.chat = schema is ChatBody

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        started = time.perf_counter()
        headers = dict(scope["headers"])
        rid = headers.get(b"x-request-id", b"").decode("latin-1") or gw.new_request_id()
        headers[b"x-request-id"] = rid.encode("latin-1")
        extra = [(b"x-request-id", rid.encode("latin-1"))]
        try:
            model, stream, body, data, pinned, exclude = await self._admit(scope, receive, headers)
        except ClientError as e:
            gw.telemetry.child(gw.telemetry.rejected, f"http_{e.status}").inc()
            await _send_json(
                send,
                e.status,
                error_body(
                    e.status, e.message, ERROR_TYPES.get(e.status, "BadRequestError"), e.param
                ),
                [*extra, *e.headers],
            )
            return
        # The client may go away at any point: a watcher cancels this task, and with it the
        # upstream request. (One extra task, not two and an asyncio.wait: measurably cheaper.)
        me = asyncio.current_task()
        assert me is not None
        gone: list[bool] = []
        watch = asyncio.get_running_loop().create_task(_cancel_on_disconnect(receive, me, gone))
        try:
            await self._route_and_forward(
                model, stream, body, data, pinned, exclude, headers, send, extra, rid, started
            )
        except asyncio.CancelledError:
            if not gone:
                raise
            me.uncancel()
            log.info("client disconnected", extra={"fields": {"request_id": rid}})
        finally:
            watch.cancel()

    async def _admit(
        self, scope: Scope, receive: Receive, headers: dict[bytes, bytes]
    ) -> tuple[str, bool, bytes, dict[str, Any], Role | None, frozenset[str]]:
        gw = self.gw
        if gw.api_keys and headers.get(b"authorization") not in gw.api_keys:
            raise ClientError(401, "Missing or invalid API key (Authorization: Bearer ...).")
        declared = headers.get(b"content-length")
        body = await _read_body(
            receive,
            gw.settings.max_body_bytes,
            int(declared) if declared and declared.isdigit() else None,
        )
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ClientError(400, f"Malformed JSON body: {e}") from None
        if not isinstance(data, dict):
            raise ClientError(400, "The request body must be a JSON object.")
        try:
            parsed = self.schema.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            param = ".".join(str(p) for p in err["loc"]) or None
            raise ClientError(
                400, f"{param}: {err['msg']}" if param else err["msg"], param
            ) from None
        model = getattr(parsed, "model", None)
        if model is None:
            if len(gw.models) != 1:
                raise ClientError(400, "model is required.", "model")
            (model,) = gw.models
        elif model not in gw.models:
            raise ClientError(404, f"The model `{model}` does not exist.", "model")
        pinned: Role | None = None
        if tier := headers.get(b"x-tiergate-tier"):
            try:
                pinned = Role(tier.decode().strip().lower())
            except ValueError:
                raise ClientError(
                    400, "x-tiergate-tier must be `latency` or `throughput`.", "x-tiergate-tier"
                ) from None
        exclude = self._off_triton(data, model, pinned) if gw.triton else frozenset()
        return model, bool(getattr(parsed, "stream", False)), body, data, pinned, exclude

    def _off_triton(self, data: dict[str, Any], model: str, pinned: Role | None) -> frozenset[str]:
        """The Triton backends this request must avoid: all of them for chat (the generate API
        applies no chat template) and for completions it cannot express (token-id prompts, n>1,
        echo, logprobs...). A 400 when only Triton backends could ever have served it."""
        if self.chat:
            why: Incompatible | None = Incompatible(
                None,
                "Chat completions need a chat template, which Triton's generate API does not"
                " apply; send /v1/completions with a formatted prompt",
            )
        else:
            why = incompatibility(data)
        if why is None:
            return frozenset()
        if (model, pinned) not in self.gw.generic:
            where = f" in the {pinned.value} tier" if pinned else ""
            raise ClientError(
                400, f"{why.message}. Every backend serving `{model}`{where} is Triton.", why.param
            )
        return self.gw.triton

    async def _route_and_forward(
        self,
        model: str,
        stream: bool,
        body: bytes,
        data: dict[str, Any],
        pinned: Role | None,
        exclude: frozenset[str],
        headers: dict[bytes, bytes],
        send: Send,
        extra: list[tuple[bytes, bytes]],
        rid: str,
        started: float,
    ) -> None:
        gw = self.gw
        t = gw.telemetry
        req = RouteRequest(model, pinned, stream, exclude)
        decision = gw.decide(req)
        if decision.reason == Reason.SATURATED:
            decision = await self._queue(req, decision)
        if not decision.candidates or decision.reason == Reason.SATURATED:
            status = 429 if decision.candidates else 503
            msg = (
                "Every backend is saturated; retry later."
                if status == 429
                else f"No healthy backend serves `{model}`."
            )
            t.child(t.rejected, decision.reason).inc()
            await _send_json(
                send,
                status,
                error_body(status, msg, ERROR_TYPES[status]),
                [*extra, (b"retry-after", b"1")],
            )
            return
        first = decision.candidates[0]
        t.child(t.decisions, decision.policy, decision.reason, first.role.value).inc()
        assert gw.upstream is not None
        out = await gw.upstream.forward(
            decision.candidates, self.path, body, stream, headers, send, extra, model, data
        )
        self._record(out, model, first, decision, rid, started)

    async def _queue(self, req: RouteRequest, decision: Decision) -> Decision:
        """Hold a request while everything is saturated, up to the policy's deadline."""
        gw, t = self.gw, self.gw.telemetry
        deadline = time.monotonic() + gw.settings.policy.queue_deadline_s
        t.queued.inc()
        try:
            while decision.reason == Reason.SATURATED and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                decision = gw.decide(req)
        finally:
            t.queued.dec()
        return decision

    def _record(
        self, out: Outcome, model: str, first: Backend, decision: Decision, rid: str, started: float
    ) -> None:
        t = self.gw.telemetry
        b = out.backend
        tier = b.role.value if b else "none"
        t.child(t.requests, tier, b.url if b else "none", model, str(out.status)).inc()
        elapsed = time.perf_counter() - started
        if b is not None:
            t.child(t.duration, tier, model).observe(elapsed)
            if b.role != first.role:
                t.child(t.failovers, first.role.value, b.role.value).inc()
            if out.midstream_error:
                t.child(t.midstream_errors, tier, b.url).inc()
        if b is not None and out.first_text_at is not None:
            # Streamed: the gateway's own TTFT and TPOT (vllm bench serve's definitions).
            t.child(t.ttft, tier, model).observe(out.first_text_at - started)
            tokens = out.output_tokens or out.text_events
            t.child(t.output_tokens, tier, model).inc(tokens)
            if tokens > 1 and out.last_text_at is not None:
                tpot = (out.last_text_at - out.first_text_at) / (tokens - 1)
                t.child(t.tpot, tier, model).observe(tpot)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "request",
                extra={
                    "fields": {
                        "request_id": rid,
                        "model": model,
                        "policy": decision.policy,
                        "reason": decision.reason,
                        "tier": tier,
                        "backend": b.url if b else None,
                        "status": out.status,
                        "attempts": out.attempts,
                        "ms": round(elapsed * 1000, 2),
                    }
                },
            )


async def _cancel_on_disconnect(
    receive: Receive, task: asyncio.Task[Any], gone: list[bool]
) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.append(True)
    task.cancel()


def create_app(settings: Settings) -> GatewayApp:
    gw = build_gateway(settings)

    async def models(request: Request) -> Response:
        now = int(time.time())
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": now, "owned_by": "tiergate"}
                    for m in sorted(gw.models)
                ],
            }
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        assert gw.monitor is not None
        up = gw.monitor.healthy_models()
        missing = sorted(gw.models - up)
        body = {
            "ready": not missing,
            "models": {m: m in up for m in sorted(gw.models)},
            "state_store": "ok" if gw.store.healthy else "degraded",
        }
        return JSONResponse(body, status_code=503 if missing else 200)

    async def state(request: Request) -> Response:
        """What routing sees right now: every backend's load, health and in-flight count."""
        assert gw.monitor is not None
        snap = gw.monitor.snapshot()
        backends = []
        for b in snap.backends:
            load = snap.load(b.url)
            st = gw.monitor.status[b.url]
            backends.append({
                "url": b.url, "tier": b.tier, "role": b.role.value, "models": sorted(b.models),
                "running": load.running, "waiting": load.waiting, "kv_usage": load.kv_usage,
                "inflight": load.inflight, "effective": load.effective, "healthy": load.healthy,
                "stale": load.stale, "ejected_reason": st.eject_reason if st.ejected else None,
            })  # fmt: skip
        return JSONResponse({
            "policy": gw.policy_name,
            "latency_open": gw.state.latency_open,
            "state_store": {"kind": "redis" if settings.redis_url else "memory",
                            "healthy": gw.store.healthy},
            "backends": backends,
        })  # fmt: skip

    async def metrics(request: Request) -> Response:
        gw.telemetry.state_up.labels("redis" if settings.redis_url else "memory").set(
            1 if gw.store.healthy else 0
        )
        return Response(generate_latest(gw.telemetry.registry), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        gw.session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        await gw.store.start()
        cfg = {b.url: b for t in settings.tiers for b in t.backends}
        gw.monitor = Monitor(
            [(b, cfg[b.url]) for b in gw.backends],
            settings.monitor,
            gw.session,
            gw.store,
            gw.telemetry,
        )
        gw.upstream = Upstream(
            gw.session,
            settings.retry,
            gw.monitor,
            gw.store,
            gw.telemetry,
            request_timeout_s=settings.request_timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            client_auth_passthrough=not gw.api_keys,
            clock=time.perf_counter,
        )
        await gw.monitor.start()
        log.info(
            "gateway ready",
            extra={
                "fields": {
                    "backends": len(gw.backends),
                    "models": ",".join(sorted(gw.models)),
                    "policy": gw.policy_name,
                    "state": "redis" if settings.redis_url else "memory",
                }
            },
        )
        try:
            yield
        finally:
            await gw.monitor.aclose()
            await gw.store.aclose()
            await gw.session.close()

    completions = ProxyEndpoint(gw, "/v1/completions", CompletionBody)
    chat = ProxyEndpoint(gw, "/v1/chat/completions", ChatBody)
    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/ready", ready),
        Route("/metrics", metrics),
        Route("/state", state),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gw
    return GatewayApp(app, {"/v1/completions": completions, "/v1/chat/completions": chat})


class GatewayApp:
    """The proxy endpoints are answered directly; everything else, lifespan included, goes to
    Starlette. Starlette's middleware wraps every `send` of every chunk: skipping it on the hot
    path measurably raised the requests/s one worker carries."""

    def __init__(self, app: Starlette, hot: dict[str, ProxyEndpoint]) -> None:
        self.app, self.hot = app, hot
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or (endpoint := self.hot.get(scope["path"])) is None
        ):
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await endpoint(scope, receive, tracking_send)
        except Exception:
            log.exception("unexpected error on %s", scope["path"])
            if not started:
                message = "Internal gateway error; see the gateway's log."
                await _send_json(send, 500, error_body(500, message, "InternalServerError"))
