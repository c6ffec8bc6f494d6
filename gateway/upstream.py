"""Forwarding to the engines: one pooled aiohttp session, retries before the first byte only.

The body goes upstream unchanged (vLLM's extra fields included) and the reply comes back
unchanged: JSON in one piece, SSE chunk by chunk as the engine flushes it. Nothing is sent to the
client until the chosen engine has produced its first body bytes, so until then any failure
(connect error, 429/502/503/504, a timeout, or the backend being ejected by the monitor while we
wait) is retried on the next candidate, with exponential backoff and jitter (tenacity), inside a
total deadline and a retry budget. After the first byte a failure can only be reported: as an SSE
`error` event followed by `[DONE]`, the way vLLM reports its own mid-stream errors.

A backend of kind `triton` speaks Triton's generate API instead: a completions request is
translated for it (gateway.triton) and its replies, JSON and SSE, are translated back, with the
same retries before the first byte. Requests to vLLM backends never take that path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from gateway import triton
from gateway.load.monitor import Monitor
from gateway.routing import Backend
from gateway.settings import RetryConfig
from gateway.state import InflightStore
from gateway.telemetry import Telemetry

log = logging.getLogger(__name__)

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
HOP_HEADERS = frozenset({
    b"host", b"content-length", b"content-type", b"connection", b"keep-alive",
    b"transfer-encoding", b"te", b"trailer", b"upgrade", b"authorization", b"accept-encoding",
})  # fmt: skip


class Retryable(Exception):
    """An attempt failed before any byte reached the client; `reason` is a metric label."""

    def __init__(
        self,
        reason: str,
        status: int | None = None,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason, self.status, self.body, self.headers = reason, status, body, headers or []


class RetryBudget:
    """Retries allowed: `ratio` of recent requests plus `min_per_s`, so that a failing backend
    cannot multiply the load on the others (a token bucket refilled by requests and by time)."""

    def __init__(self, ratio: float, min_per_s: float, clock: Callable[[], float]) -> None:
        self.ratio, self.min_per_s, self.clock = ratio, min_per_s, clock
        self.cap = max(10.0, min_per_s * 10)
        self.tokens = self.cap
        self.at = clock()

    def on_request(self) -> None:
        self.tokens = min(self.cap, self.tokens + self.ratio)

    def try_spend(self) -> bool:
        now = self.clock()
        self.tokens = min(self.cap, self.tokens + (now - self.at) * self.min_per_s)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass(slots=True)
class Outcome:
    """What happened to one proxied request, for telemetry and logs."""

    backend: Backend | None = None
    attempts: int = 0
    status: int = 0
    first_text_at: float | None = None
    last_text_at: float | None = None
    output_tokens: int | None = None
    text_events: int = 0
    midstream_error: str | None = None


def has_text(chunk: bytes) -> bool:
    """Whether an SSE chunk carries generated text (completions `text` or chat `content`)."""
    for key in (b'"text":"', b'"content":"'):
        i = chunk.find(key)
        while i != -1:
            if chunk[i + len(key) : i + len(key) + 1] != b'"':
                return True
            i = chunk.find(key, i + 1)
    return False


def completion_tokens(chunk: bytes) -> int | None:
    i = chunk.rfind(b'"completion_tokens":')
    if i == -1:
        return None
    j = i + len(b'"completion_tokens":')
    end = j
    while end < len(chunk) and chunk[end : end + 1] in b" 0123456789":
        end += 1
    try:
        return int(chunk[j:end])
    except ValueError:
        return None


def error_event(message: str, code: int = 502) -> bytes:
    err = {"error": {"message": message, "type": "BadGatewayError", "param": None, "code": code}}
    return b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n"


class Upstream:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        retry: RetryConfig,
        monitor: Monitor,
        store: InflightStore,
        telemetry: Telemetry,
        *,
        request_timeout_s: float,
        connect_timeout_s: float,
        client_auth_passthrough: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.retry = retry
        self.monitor = monitor
        self.store = store
        self.telemetry = telemetry
        self.passthrough_auth = client_auth_passthrough
        self.clock = clock
        self.budget = RetryBudget(retry.budget_ratio, retry.budget_min_per_s, clock)
        self.timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=request_timeout_s
        )
        self.retry_statuses = frozenset(retry.retry_statuses)
        # Triton backends: url -> the repository name of each model clients ask for.
        self._triton: dict[str, dict[str, str]] = {
            url: {m: st.config.triton_models.get(m, m) for m in st.config.models}
            for url, st in monitor.status.items()
            if st.config.kind == "triton"
        }
        # Attempts still waiting for their first byte, by backend: cancelled when it is ejected.
        self._waiting: dict[str, set[asyncio.Task[Any]]] = {}
        self._ejected_tasks: set[asyncio.Task[Any]] = set()
        monitor.on_eject.append(self._cancel_waiting)

    def _cancel_waiting(self, url: str) -> None:
        # An attempt whose own failure caused the ejection is already moving on: spare it.
        current = asyncio.current_task()
        for task in self._waiting.pop(url, ()):
            if task is not current:
                self._ejected_tasks.add(task)
                task.cancel()

    def _headers(self, backend: Backend, client: dict[bytes, bytes]) -> dict[str, str]:
        # End-to-end client headers go on (x-request-id, tracing, engine-specific ones); those
        # that describe this hop, the encoding we relay untouched, and credentials do not.
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in client.items()
            if k not in HOP_HEADERS and not k.startswith((b"x-tiergate-", b"proxy-"))
        }
        headers["content-type"] = "application/json"
        key = self.monitor.status[backend.url].config.api_key
        if key is not None:
            headers["authorization"] = f"Bearer {key.get_secret_value()}"
        elif self.passthrough_auth and (auth := client.get(b"authorization")):
            headers["authorization"] = auth.decode("latin-1")
        return headers

    async def forward(
        self,
        candidates: tuple[Backend, ...],
        path: str,
        body: bytes,
        stream: bool,
        client_headers: dict[bytes, bytes],
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        model: str = "",
        data: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """Send the request to the candidates in order until one answers; relay its reply.
        `model` (the name the client asked for) and `data` (the body, parsed) are needed only
        when a candidate is Triton."""
        out = Outcome()
        self.budget.on_request()
        call = None
        if self._triton and any(c.url in self._triton for c in candidates):
            call = self._triton_call(data or {}, stream, model, client_headers)
        args = (path, body, stream, client_headers, send, extra_headers, out, call)
        started = self.clock()
        # The first attempt runs outside tenacity: most requests need no retry, and building
        # the retry machinery for each of them cost a measurable share of the gateway's CPU.
        try:
            await self._attempt(candidates[0], *args)
            return out
        except Retryable as e:
            self._failed(candidates[0], e, 1)
            last = e
        remaining = min(self.retry.max_attempts, len(candidates)) - 1
        deadline = self.retry.deadline_s - (self.clock() - started)
        if remaining > 0 and deadline > 0:
            # Backoff: initial (+ jitter) before the 2nd attempt, then doubling, as tenacity
            # would have waited had it run the first attempt too.
            initial = self.retry.backoff_initial_s
            await asyncio.sleep(initial + random.uniform(0, initial))
            retrying = AsyncRetrying(
                stop=stop_after_attempt(remaining) | stop_after_delay(deadline),
                wait=wait_exponential_jitter(
                    initial=2 * initial, max=self.retry.backoff_max_s, jitter=initial
                ),
                retry=retry_if_exception_type(Retryable),
            )
            try:
                async for attempt in retrying:
                    n = attempt.retry_state.attempt_number + 1
                    if not self.budget.try_spend():
                        self.telemetry.child(self.telemetry.rejected, "retry_budget").inc()
                        break
                    served = False
                    with attempt:
                        try:
                            await self._attempt(candidates[n - 1], *args)
                            served = True
                        except Retryable as e:
                            self._failed(candidates[n - 1], e, n)
                            last = e
                            raise
                    if served:
                        return out
            except RetryError:
                pass
        await self._give_up(out, last, send, extra_headers)
        return out

    @staticmethod
    def _triton_call(
        data: Mapping[str, Any], stream: bool, model: str, client_headers: dict[bytes, bytes]
    ) -> triton.Call:
        # Only completions reach here: the app keeps chat and untranslatable requests off
        # Triton backends before routing.
        rid = client_headers.get(b"x-request-id", b"").decode("latin-1")
        return triton.prepare(
            data, model=model, stream=stream, request_id=rid, created=int(time.time())
        )

    def _failed(self, backend: Backend, e: Retryable, attempt: int) -> None:
        self.telemetry.child(self.telemetry.retries, backend.url, e.reason).inc()
        log.info("attempt failed before first byte", extra={"fields": {
            "backend": backend.url, "reason": e.reason, "attempt": attempt}})  # fmt: skip

    async def _attempt(
        self,
        backend: Backend,
        path: str,
        body: bytes,
        stream: bool,
        client_headers: dict[bytes, bytes],
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
        out: Outcome,
        call: triton.Call | None = None,
    ) -> None:
        url = backend.url
        names = None if call is None else self._triton.get(url)
        out.attempts += 1
        task = asyncio.current_task()
        assert task is not None
        waiting = self._waiting.setdefault(url, set())
        waiting.add(task)
        self.store.acquire(url)
        gauge = self.telemetry.child(self.telemetry.inflight, backend.role.value, url)
        gauge.inc()
        resp: aiohttp.ClientResponse | None = None
        try:
            try:
                target, payload = url + path, body
                if names is not None:
                    assert call is not None
                    name = names.get(call.model, call.model)
                    target, payload = url + call.path(name), call.body
                resp = await self.session.post(
                    target,
                    data=payload,
                    timeout=self.timeout,
                    headers=self._headers(backend, client_headers),
                )
                if resp.status in self.retry_statuses:
                    data = await resp.read()
                    self.monitor.request_failed(url, f"http_{resp.status}")
                    hdrs = [
                        (b"retry-after", v.encode()) for v in resp.headers.getall("Retry-After", [])
                    ]
                    if names is not None:
                        data = triton.error_reply(resp.status, data)[1]
                    raise Retryable(f"http_{resp.status}", resp.status, data, hdrs)
                if stream and resp.status == 200:
                    async with asyncio.timeout(self.retry.first_byte_timeout_s):
                        first = await resp.content.readany()
                else:
                    first = await resp.read()
                if stream and resp.status == 200 and not first:
                    raise Retryable("empty_stream")
            except asyncio.CancelledError:
                if task in self._ejected_tasks:
                    self._ejected_tasks.discard(task)
                    task.uncancel()
                    raise Retryable("ejected") from None
                raise
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as e:
                self.monitor.request_failed(url, "connect")
                raise Retryable(type(e).__name__) from e
            finally:
                waiting.discard(task)
            # First byte in hand: from here on, the client gets what the engine says.
            self.monitor.request_succeeded(url)
            out.backend, out.status = backend, resp.status
            ctype = resp.headers.get("Content-Type", "application/json").encode()
            if names is not None and not (stream and resp.status == 200):
                assert call is not None
                out.status, first = call.reply(resp.status, first)
                ctype = b"application/json"
            headers = [
                (b"content-type", ctype),
                *extra_headers,
                (b"x-tiergate-tier", backend.role.value.encode()),
                (b"x-tiergate-backend", url.encode()),
                (b"x-tiergate-attempts", str(out.attempts).encode()),
            ]
            if not (stream and resp.status == 200):
                headers.append((b"content-length", str(len(first)).encode()))
                await send(
                    {"type": "http.response.start", "status": out.status, "headers": headers}
                )
                await send({"type": "http.response.body", "body": first})
                return
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            if names is None:
                await self._relay(resp, first, send, out)
            else:
                assert call is not None
                await self._relay_triton(resp, first, send, out, call.stream_translator())
        finally:
            self.store.release(url)
            gauge.dec()
            if resp is not None:
                resp.release()

    async def _relay(
        self, resp: aiohttp.ClientResponse, first: bytes, send: Send, out: Outcome
    ) -> None:
        chunk = first
        try:
            while chunk:
                now = self.clock()
                if has_text(chunk):
                    if out.first_text_at is None:
                        out.first_text_at = now
                    out.last_text_at = now
                    out.text_events += chunk.count(b"data: ")
                if b'data: {"error"' in chunk:
                    # The engine's own mid-stream error event (vLLM's way), relayed as is; it
                    # can share a read with the last text.
                    out.midstream_error = "engine_error"
                if b'"usage"' in chunk and (n := completion_tokens(chunk)) is not None:
                    out.output_tokens = n
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await resp.content.readany()
        except (aiohttp.ClientError, TimeoutError) as e:
            out.midstream_error = type(e).__name__
            log.warning(
                "stream broke after first byte",
                extra={"fields": {"backend": str(resp.url.origin()), "error": out.midstream_error}},
            )
            await send(
                {
                    "type": "http.response.body",
                    "more_body": True,
                    "body": error_event(f"upstream stream failed: {out.midstream_error}"),
                }
            )
        await send({"type": "http.response.body", "body": b""})

    async def _relay_triton(
        self,
        resp: aiohttp.ClientResponse,
        first: bytes,
        send: Send,
        out: Outcome,
        tr: triton.StreamTranslator,
    ) -> None:
        """_relay for a Triton stream: every event is translated, and the stream gets the
        OpenAI ending ([DONE], usage when asked) that Triton does not send."""
        chunk = first
        try:
            while chunk:
                seen = tr.text_events
                data = tr.feed(chunk)
                if tr.text_events != seen:
                    now = self.clock()
                    if out.first_text_at is None:
                        out.first_text_at = now
                    out.last_text_at = now
                if data:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                chunk = await resp.content.readany()
            tail = tr.close()
        except (aiohttp.ClientError, TimeoutError) as e:
            out.midstream_error = type(e).__name__
            log.warning(
                "stream broke after first byte",
                extra={"fields": {"backend": str(resp.url.origin()), "error": out.midstream_error}},
            )
            tail = tr.fail(f"upstream stream failed: {out.midstream_error}")
        out.text_events, out.output_tokens = tr.text_events, tr.completion_tokens
        await send({"type": "http.response.body", "body": tail, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _give_up(
        self,
        out: Outcome,
        last: Retryable | None,
        send: Send,
        extra_headers: list[tuple[bytes, bytes]],
    ) -> None:
        headers = [(b"x-tiergate-attempts", str(out.attempts).encode()), *extra_headers]
        if last is not None and last.status is not None:
            # Every candidate refused: pass the last engine's answer on as it was.
            out.status = last.status
            body = last.body
            headers += [(b"content-type", b"application/json"), *last.headers]
        else:
            out.status = 502
            reason = last.reason if last else "no attempt"
            body = json.dumps(
                {
                    "error": {
                        "message": f"no backend answered after {out.attempts} attempt(s) "
                        f"(last failure: {reason})",
                        "type": "BadGatewayError",
                        "param": None,
                        "code": 502,
                    }
                }
            ).encode()
            headers.append((b"content-type", b"application/json"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": out.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
