"""Forwarding one exchange to the engines: one pooled aiohttp session, the candidates tried in
the decision's order by the retry executor, each attempt under a registry lease, the engine's
protocol behind its wire adapter.

Nothing is sent to the client until the chosen engine has produced its first body bytes, so
until then any failure (connect error, a retryable status, a timeout, or the backend being
ejected while we wait) moves on to the next candidate. After the first byte a failure can only
be reported: as an SSE `error` event followed by `[DONE]`, the way vLLM reports its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

import aiohttp

from gateway.errors import error_json
from gateway.exchange import Exchange
from gateway.registry import BackendEntry, Registry
from gateway.retry import Retryable, RetryExecutor
from gateway.routing import Backend, Decision
from gateway.settings import Settings
from gateway.telemetry import Telemetry
from gateway.wire import StreamRelay

__all__ = ["Upstream"]

log = logging.getLogger(__name__)

# Client headers that describe this hop, the encoding relayed untouched, or credentials: not
# forwarded. Everything else (x-request-id, tracing, engine-specific headers) goes on.
HOP_HEADERS = frozenset({
    b"host", b"content-length", b"content-type", b"connection", b"keep-alive",
    b"transfer-encoding", b"te", b"trailer", b"upgrade", b"authorization", b"accept-encoding",
})  # fmt: skip
_RETRY_AFTER = "Retry-After"


def _uncancel() -> None:
    """Take back the cancellation that asked this task to end its answer: it ends it itself."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class Upstream:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        registry: Registry,
        telemetry: Telemetry,
        settings: Settings,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.session, self.registry, self.telemetry, self.clock = (
            session, registry, telemetry, clock)  # fmt: skip
        self.retry = RetryExecutor(settings.retry, self)
        self.first_byte_timeout_s = settings.retry.first_byte_timeout_s
        self.timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.connect_timeout_s,
            sock_read=settings.request_timeout_s,
        )  # fmt: skip
        # With no API keys of its own, the gateway lets the client's credentials through.
        self.passthrough_auth = not settings.api_keys

    async def forward(self, ex: Exchange, decision: Decision) -> None:
        """Answer `ex` from the first candidate that answers; the last failure otherwise."""
        try:
            failed = await self.retry.run(decision.candidates, functools.partial(self._attempt, ex))
        except asyncio.CancelledError:
            if ex.cut_reason is None or ex.responded:
                raise
            _uncancel()
            ex.status = 503
            await ex.answer(503, [(b"content-type", b"application/json"), *ex.response_headers],
                            error_json(503, ex.cut_reason))  # fmt: skip
            return
        if failed is not None:
            await self._give_up(ex, failed)

    # -- RetryHooks ------------------------------------------------------------------------
    def attempt_failed(self, backend: Backend, error: Retryable, attempt: int) -> None:
        self.telemetry.child(self.telemetry.retries, backend.url, error.reason).inc()
        log.info("attempt failed before first byte", extra={"fields": {
            "backend": backend.url, "reason": error.reason, "attempt": attempt}})  # fmt: skip

    def budget_exhausted(self) -> None:
        self.telemetry.child(self.telemetry.rejected, "retry_budget").inc()

    # -- one attempt -----------------------------------------------------------------------
    def _headers(self, ex: Exchange, entry: BackendEntry) -> dict[str, str]:
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in ex.headers.items()
            if k not in HOP_HEADERS and not k.startswith((b"x-tiergate-", b"proxy-"))
        }
        headers["content-type"] = "application/json"
        if entry.auth:
            headers.update(entry.auth)
        elif self.passthrough_auth and (auth := ex.headers.get(b"authorization")):
            headers["authorization"] = auth.decode("latin-1")
        return headers

    async def _attempt(self, ex: Exchange, backend: Backend) -> None:
        entry = self.registry.entry(backend.url)
        wire = entry.adapter
        ex.attempts += 1
        with self.registry.lease(entry, ex.slo.tpot_s) as lease:
            ex.joined_at_load = entry.busy  # this attempt included
            resp: aiohttp.ClientResponse | None = None
            try:
                try:
                    path, payload = wire.request(ex, entry.config)
                    resp = await self.session.post(
                        backend.url + path, data=payload, timeout=self.timeout,
                        headers=self._headers(ex, entry),
                    )  # fmt: skip
                    if self.retry.retryable(resp.status):
                        refused = await resp.read()
                        self.registry.request_failed(entry, f"http_{resp.status}")
                        after = [(b"retry-after", v.encode())
                                 for v in resp.headers.getall(_RETRY_AFTER, [])]  # fmt: skip
                        raise Retryable(f"http_{resp.status}", resp.status,
                                        wire.refused(resp.status, refused), after)  # fmt: skip
                    streaming = ex.stream and resp.status == 200
                    if streaming:
                        async with asyncio.timeout(self.first_byte_timeout_s):
                            first = await resp.content.readany()
                        if not first:
                            raise Retryable("empty_stream")
                    else:
                        first = await resp.read()
                except asyncio.CancelledError:
                    if lease.ejected:
                        lease.task.uncancel()
                        raise Retryable("ejected") from None
                    raise
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                        TimeoutError) as e:  # fmt: skip
                    self.registry.request_failed(entry, "connect")
                    raise Retryable(type(e).__name__) from e
                # First byte in hand: from here on, the client gets what the engine says.
                lease.first_byte()
                self.registry.request_succeeded(entry)
                ex.backend, ex.status = backend, resp.status
                ex.busy_mark = entry.busy_mark(self.registry.clock())
                ctype = resp.headers.get("Content-Type", "application/json").encode()
                headers = [
                    *ex.response_headers,
                    (b"x-tiergate-tier", backend.role.value.encode()),
                    (b"x-tiergate-backend", backend.url.encode()),
                    (b"x-tiergate-attempts", str(ex.attempts).encode()),
                ]
                if streaming:
                    headers.append((b"content-type", ctype))
                    await ex.start_response(200, headers)
                    await self._relay(ex, resp, first, wire.relay(ex))
                    return
                ex.status, body, ctype = wire.reply(ex, resp.status, first, ctype)
                headers.append((b"content-type", ctype))
                await ex.answer(ex.status, headers, body)
            finally:
                if resp is not None:
                    resp.release()

    async def _relay(
        self, ex: Exchange, resp: aiohttp.ClientResponse, first: bytes, relay: StreamRelay
    ) -> None:
        """The stream, chunk by chunk as the engine flushes it, timing the text as it passes."""
        send, chunk = ex.send, first
        try:
            while chunk:
                out, text = relay.feed(chunk)
                if text:
                    now = self.clock()
                    if ex.first_text_at is None:
                        ex.first_text_at = now
                    ex.last_text_at = now
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                chunk = await resp.content.readany()
            tail = relay.close()
        except (aiohttp.ClientError, TimeoutError) as e:
            ex.midstream_error = type(e).__name__
            log.warning("stream broke after first byte", extra={"fields": {
                "request_id": ex.id, "backend": str(resp.url.origin()),
                "error": ex.midstream_error}})  # fmt: skip
            tail = relay.fail(f"upstream stream failed: {ex.midstream_error}")
        except asyncio.CancelledError:
            if ex.cut_reason is None:
                raise  # the client went away: nothing to tell it
            _uncancel()
            ex.midstream_error = "cut"
            tail = relay.fail(ex.cut_reason)
        ex.text_events, ex.output_tokens = relay.text_events, relay.completion_tokens
        if relay.engine_error and ex.midstream_error is None:
            ex.midstream_error = "engine_error"
        if tail:
            await send({"type": "http.response.body", "body": tail, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _give_up(self, ex: Exchange, last: Retryable) -> None:
        headers = [(b"x-tiergate-attempts", str(ex.attempts).encode()), *ex.response_headers]
        if last.status is not None:
            # Every candidate refused: pass the last engine's answer on as it was.
            ex.status, body = last.status, last.body
            headers += [(b"content-type", b"application/json"), *last.headers]
        else:
            ex.status = 502
            body = error_json(502, f"no backend answered after {ex.attempts} attempt(s) "
                                   f"(last failure: {last.reason})")  # fmt: skip
            headers.append((b"content-type", b"application/json"))
        await ex.answer(ex.status, headers, body)
