"""Forwarding one exchange to the engines: one pooled aiohttp session, the candidates tried in
the decision's order by the retry executor, each attempt under a registry lease, the engine's
protocol behind its wire adapter.

Nothing is sent to the client until the chosen engine has produced its first body bytes, so
until then any failure (connect error, a retryable status, a timeout, or the backend being
ejected while we wait) moves on to the next candidate. An engine that refuses the gateway's
credentials (401/403) is the gateway's misconfiguration: that backend is ejected, the request
tried elsewhere, and answered 502 if nowhere else could take it. After the first byte a failure
can only be reported: as an SSE `error` event followed by `[DONE]`, the way vLLM reports its
own; a stream whose engine goes silent (gateway.pipeline.watchdog) or is ejected is cut the same
way. Every outcome feeds the backend's outlier detection (gateway.backends.outlier).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any, Protocol, cast

import aiohttp

from gateway.backends.registry import BackendEntry, Lease, Registry
from gateway.config.settings import Settings
from gateway.core.errors import error_json
from gateway.core.exchange import ConnectionWriter, Exchange, Trace
from gateway.core.http1 import Http1Pool, Http1Response
from gateway.core.transport import UpstreamResponse
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.continuation import SplicedRelay, continued_body, replay, whole_events
from gateway.pipeline.hedge import hedge_after, hedge_backend
from gateway.pipeline.retry import Displaced, Full, Gone, Retryable, RetryExecutor
from gateway.pipeline.watchdog import StreamWatchdog
from gateway.routing import Backend, Decision
from gateway.wire import StreamRelay

__all__ = ["SlowStarts", "Upstream"]

log = logging.getLogger(__name__)

# Client headers that describe this hop, the encoding relayed untouched, or credentials: not
# forwarded. Everything else (x-request-id, tracing, engine-specific headers) goes on.
HOP_HEADERS = frozenset({
    b"host", b"content-length", b"content-type", b"connection", b"keep-alive",
    b"transfer-encoding", b"te", b"trailer", b"upgrade", b"authorization", b"accept-encoding",
})  # fmt: skip
_RETRY_AFTER = "Retry-After"
_REFUSED_CREDENTIALS = frozenset({401, 403})
_DONE_EVENT = b"data: [DONE]\n\n"
# A client's opt-out of continuation for its request.
_CONTINUE = b"x-tiergate-continue"
_OFF = frozenset({b"off", b"false", b"0", b"no"})
# Why the gateway cut a stream, as the client reads it in the stream's error event.
_CUT_MESSAGES = {
    "ejected": "the backend serving this stream was taken out of rotation",
    "idle": "the backend serving this stream stopped sending",
    "left": "the backend serving this stream left the pool",
}


def _uncancel() -> None:
    """Take back the cancellation that asked this task to end its answer: it ends it itself."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class SlowStarts(Protocol):
    """Who learns that a backend was slow to start a stream (gateway.backends.learner.Learner)."""

    def slow_start(self, url: str, load: int, waited: float) -> None: ...


class Upstream:
    def __init__(
        self,
        pool: Http1Pool,
        registry: Registry,
        telemetry: Telemetry,
        settings: Settings,
        learner: SlowStarts | None = None,
    ) -> None:
        self.pool, self.registry, self.telemetry = pool, registry, telemetry
        self.clock = time.perf_counter
        # Who learns from hedges (the latency model).
        self.learner = learner
        self.retry = RetryExecutor(settings.retry, self)
        self.continuation = settings.continuation
        self.hedge = settings.hedge
        self.watchdog = StreamWatchdog(registry, settings.stream_idle_timeout_s, self.clock)
        self.first_byte_timeout_s = settings.retry.first_byte_timeout_s
        # With no API keys of its own, the gateway lets the client's credentials through.
        self.passthrough_auth = not settings.api_keys and not settings.tenants

    async def forward(self, ex: Exchange, decision: Decision) -> bool:
        """Answer `ex` from the first candidate that answers; the last failure otherwise.
        False, with nothing answered, when every candidate tried was full (`Full`), or its
        place went to a request of a higher priority (`Displaced`): the request goes back to
        admission."""
        # A cut before the first byte (the drain's deadline) is answered by the app, which
        # covers every stage before this one too; after it, the stream is ended here.
        attempt = self._attempt if ex.trace is None else self._traced_attempt
        failed = await self.retry.run(decision.candidates, functools.partial(attempt, ex))
        if isinstance(failed, Full):
            ex.displaced = isinstance(failed, Displaced)
            return False
        if failed is not None:
            await self._give_up(ex, failed)
        return True

    async def aclose(self) -> None:
        """Close the kinds' own transports (the HTTP pool is its owner's to close)."""
        for own in [*(e.own_transport for e in self.registry), *self.registry.closing]:
            if own is not None:
                await own.aclose()
        self.registry.closing.clear()

    # -- RetryHooks ------------------------------------------------------------------------
    def attempt_failed(self, backend: Backend, error: Retryable, attempt: int) -> None:
        self.telemetry.child(self.telemetry.attempts, backend.url, error.reason).inc()
        log.info("attempt failed before first byte", extra={"fields": {
            "backend": backend.url, "reason": error.reason, "attempt": attempt}})  # fmt: skip

    def retrying(self, failed: Backend, error: Retryable) -> None:
        self.telemetry.child(self.telemetry.retries, failed.url, error.reason).inc()

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
        if ex.trace is not None:  # the engine continues the attempt's trace
            ex.trace.inject(headers)
        return headers

    async def _traced_attempt(self, ex: Exchange, backend: Backend) -> None:
        with cast("Trace", ex.trace).attempt(ex, backend):
            await self._attempt(ex, backend)

    async def _attempt(self, ex: Exchange, backend: Backend) -> None:
        entry = self.registry.entries.get(backend.url)
        if entry is None or entry.left_at is not None:
            raise Gone  # it left the pool since the decision
        wire = entry.adapter
        ex.attempts += 1
        with self.registry.lease(entry, ex.slo.tpot_s, ex.task) as primary:
            if ex.priority is not None and ex.tenant is not None:  # priorities on
                primary.rank = ex.tenant.rank
            ex.joined_at_load = entry.busy  # this attempt included
            lease, resp, first = await self._open(ex, primary, wire.request(ex, entry.options))
            if lease is not primary:  # a hedge answered first: it serves the request
                backend, entry, wire = lease.entry.backend, lease.entry, lease.entry.adapter
            try:
                ex.backend, ex.status = backend, resp.status
                ex.busy_mark = entry.busy_mark(self.registry.clock())
                ctype = resp.headers.get("Content-Type", "application/json").encode()
                headers = [
                    *ex.response_headers,
                    *entry.served_by,
                    (b"x-tiergate-attempts", b"%d" % ex.attempts),
                ]
                if not (ex.stream and resp.status == 200):
                    ex.status, body, ctype = wire.reply(ex, resp.status, first, ctype)
                    headers.append((b"content-type", ctype))
                    await ex.answer(ex.status, headers, body)
                    return
                headers.append((b"content-type", ctype))
                await ex.start_stream(headers)
                if self.continuation.enabled and ex.headers.get(_CONTINUE) not in _OFF:
                    ex.transcript = []
                relay = wire.relay(ex)
                if ex.trace is not None:
                    ex.trace.streaming()
                broken = await self._relay(ex, resp, first, relay, lease)
            finally:
                resp.release()
                lease.__exit__(None, None, None)  # the hedge's, if it won (a no-op otherwise)
        if broken is not None:
            # The lease is given back: a continuation takes its own elsewhere.
            status = 502
            try:
                failed = await self._continue(ex, broken)
            except asyncio.CancelledError:
                if ex.cut_reason is None:
                    raise  # the client went away
                _uncancel()  # the drain's deadline came while it was being continued
                failed, status = ex.cut_reason, 503
            if failed is not None:
                await ex.end_stream(relay.fail(failed, status))

    async def _open(
        self, ex: Exchange, lease: Lease, request: tuple[str, bytes], hedge: bool = True
    ) -> tuple[Lease, UpstreamResponse, bytes]:
        """Send `request` (path, body) to the lease's backend and wait for its first body
        bytes (a whole answer when it does not stream); Retryable if that fails. A stream
        slow to start is hedged (gateway.pipeline.hedge) unless `hedge` is False: the lease,
        response and bytes returned are then the first to answer."""
        entry = lease.entry
        if not lease.held:  # a capped backend filled up since the decision (Lease.__enter__)
            raise Full
        wire = entry.adapter
        resp: UpstreamResponse | None = None
        after = self._hedge_after(ex) if hedge and ex.stream else None
        try:
            path, payload = request
            # A stream's headers come at once from a live engine: one that accepts the
            # connection but answers nothing by the hedge deadline is abandoned.
            transport = entry.own_transport or self.pool
            post = transport.post(entry.url, path, payload, self._headers(ex, entry))
            if after is None:  # no hedge: no deadline on the headers beyond the client's own
                resp = await post
            else:
                async with asyncio.timeout(after):
                    resp = await post
            if resp.status in _REFUSED_CREDENTIALS:
                await resp.read()
                raise self._misconfigured(entry, resp.status)
            if self.retry.retryable(resp.status) and resp.status not in wire.ambiguous:
                body = wire.refused(resp.status, await resp.read())
                retry_after = [(b"retry-after", v.encode())
                               for v in resp.headers.getall(_RETRY_AFTER, [])]  # fmt: skip
                raise self._refused(ex, entry, f"http_{resp.status}",
                                    (resp.status, body, retry_after))  # fmt: skip
            if ex.stream and resp.status == 200:
                winner, resp, first = await self._first_bytes(ex, lease, resp, after)
                if winner is not lease:
                    return winner, resp, first
                if not first:
                    raise Retryable("empty_stream")
                early = wire.early_error(first)
                if early is not None and self.retry.retryable(early[0]):
                    raise self._refused(ex, entry, f"event_{early[0]}", (*early, []))
            else:
                first = await resp.read()
        except asyncio.CancelledError:
            if resp is not None:
                resp.release()
            if lease.ejected:
                lease.task.uncancel()
                raise Retryable("ejected") from None
            if lease.gone:
                lease.task.uncancel()
                raise Gone from None
            if lease.displaced:
                lease.task.uncancel()
                raise Displaced from None
            raise
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as e:
            if resp is not None:
                resp.release()
            self.registry.request_failed(entry, "connect")
            raise Retryable(type(e).__name__, detail=str(e)) from e
        except Retryable:
            if resp is not None:
                resp.release()
            raise
        # First byte in hand: from here on, the client gets what the engine says.
        lease.first_byte(self.clock(), resp.close)
        self.registry.request_succeeded(entry)
        self.telemetry.add((self.telemetry.attempts, entry.url, "ok"))
        return lease, resp, first

    async def _first_bytes(
        self, ex: Exchange, lease: Lease, resp: UpstreamResponse, after: float | None
    ) -> tuple[Lease, UpstreamResponse, bytes]:
        """A stream's first bytes, hedged past `after` seconds (None: never) when another
        candidate can take it."""
        entry, limit = lease.entry, self.first_byte_timeout_s
        if after is not None and after < limit:
            try:
                async with asyncio.timeout(after):
                    return lease, resp, await resp.content.readany()
            except TimeoutError:
                entries = self.registry.entries
                unusable = ex.failed_urls | {
                    b.url for b in ex.decision.candidates
                    if (e := entries.get(b.url)) is None or e.live.ejected
                    or e.left_at is not None}  # fmt: skip
                other = hedge_backend(ex.decision.candidates, entry.url, unusable)
                if other is not None:
                    return await self._hedge(ex, lease, resp, (other, limit - after))
                limit -= after
        async with asyncio.timeout(limit):
            return lease, resp, await resp.content.readany()

    def _hedge_after(self, ex: Exchange) -> float | None:
        curves, entries = self.registry.curves, self.registry.entries
        return hedge_after(self.hedge, ((curves.get(b.url), e.busy)
                                        for b in ex.decision.candidates
                                        if (e := entries.get(b.url)) is not None))  # fmt: skip

    async def _hedge(
        self,
        ex: Exchange,
        lease: Lease,
        resp: UpstreamResponse,
        to: tuple[Backend, float],
    ) -> tuple[Lease, UpstreamResponse, bytes]:
        """Race the slow stream against the same request on `to` (a backend, and the seconds
        left): the first bytes to arrive win; the loser is closed and its lease given back.
        The slow backend's wait so far teaches the latency model a TTFT it at least has."""
        backend, left = to
        started = self.clock()
        ex.attempts += 1
        if self.learner is not None:  # at once: the next decisions should know
            self.learner.slow_start(lease.entry.url, lease.entry.busy, started - ex.started)
        log.info("slow first token: hedging", extra={"fields": {
            "request_id": ex.id, "slow": lease.entry.url, "hedge": backend.url}})  # fmt: skip
        slow = asyncio.ensure_future(resp.content.readany())
        fast = asyncio.ensure_future(self._hedge_attempt(ex, backend))
        pending: set[asyncio.Future[Any]] = {slow, fast}
        took_fast = False
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=left - (self.clock() - started),
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                if not done:
                    raise TimeoutError
                if slow in done and slow.exception() is None and slow.result():
                    self._hedge_outcome("lost")
                    return lease, resp, slow.result()
                if fast in done and fast.exception() is None:
                    took_fast = True
                    self._hedge_outcome("won")
                    # Slow is the new down: a backend whose streams have to be hedged fails
                    # its clients, and its outliers are ejected like any other failures.
                    self.registry.request_failed(lease.entry, "slow_start")
                    resp.close()
                    lease.__exit__(None, None, None)
                    won: tuple[Lease, UpstreamResponse, bytes] = fast.result()
                    return won
            error = slow.exception() or fast.exception()
            raise error if error is not None else Retryable("empty_stream")
        finally:
            for f in (slow, fast):
                f.cancel()
            await asyncio.gather(slow, fast, return_exceptions=True)
            if not took_fast and not fast.cancelled() and fast.exception() is None:
                hedge_lease, hedge_resp, _ = fast.result()  # answered, but second: close it
                hedge_resp.close()
                hedge_lease.__exit__(None, None, None)

    async def _hedge_attempt(
        self, ex: Exchange, backend: Backend
    ) -> tuple[Lease, UpstreamResponse, bytes]:
        """The hedge's own attempt, in a task of its own (so its lease is cancelled alone if
        its backend is ejected); its lease outlives the task when it wins."""
        entry = self.registry.entries.get(backend.url)
        if entry is None or entry.left_at is not None:
            raise Gone
        lease = self.registry.lease(entry, ex.slo.tpot_s).__enter__()
        try:
            return await self._open(ex, lease, entry.adapter.request(ex, entry.options), False)
        except BaseException:
            lease.__exit__(None, None, None)
            raise

    def _hedge_outcome(self, outcome: str) -> None:
        self.telemetry.child(self.telemetry.hedges, outcome).inc()

    def _refused(
        self,
        ex: Exchange,
        entry: BackendEntry,
        reason: str,
        answer: tuple[int, bytes, list[tuple[bytes, bytes]]],
    ) -> Retryable:
        """An engine refused the request before answering anything: try elsewhere, and keep
        its answer (status, body, headers) for the client should it be the last. 408 and 429
        say "busy", not "broken". A request one engine answered with a 5xx already is suspect
        itself (a request that breaks every engine would otherwise eject them all): its next
        5xx is not held against a backend."""
        status, body, headers = answer
        if status >= 500:
            ex.server_errors += 1
            if ex.server_errors == 1:
                self.registry.request_failed(entry, reason)
        return Retryable(reason, status, body, headers)

    def _misconfigured(self, entry: BackendEntry, status: int) -> Retryable:
        """The engine refused the gateway's credentials: eject it, try elsewhere, and should
        nothing else answer, tell the client it is the gateway's fault, not theirs."""
        self.registry.request_failed(entry, "auth", fatal=True)
        message = (
            f"The gateway's backend {entry.url} refused the gateway's credentials (HTTP "
            f"{status}): its api_key in the gateway's configuration is wrong or missing."
        )
        return Retryable("auth", 502, error_json(502, message))

    async def _relay(
        self,
        ex: Exchange,
        resp: UpstreamResponse,
        first: bytes,
        relay: StreamRelay,
        lease: Lease,
    ) -> str | None:
        """The stream, chunk by chunk as the engine flushes it, timing the text as it passes
        and noting each chunk's arrival for the watchdog. Only whole SSE events go out, so a
        stream that breaks can be ended or continued cleanly. None when the engine ended the
        stream (it is finished then); why it broke otherwise (the caller ends it)."""
        writer = ex.writer
        events = _Events(ex, relay, lease, self.clock)
        try:
            if writer is None:  # another ASGI server: its messages
                chunk = first
                while chunk:
                    if out := events(chunk):
                        await ex.send({"type": "http.response.body", "body": out,
                                       "more_body": True})  # fmt: skip
                    chunk = await resp.content.readany()
            else:
                if events.write(first):
                    await writer.drain()
                writer.flush()  # the stream's start, held for a first chunk not yet whole
                if isinstance(resp, Http1Response):
                    # Each later piece written from the engine connection's own callback.
                    await resp.pump(events.write, writer.drain)
                else:
                    while chunk := await resp.content.readany():
                        if events.write(chunk):
                            await writer.drain()
            tail = relay.close()
            if ex.transcript is not None and not (events.last + tail).endswith(_DONE_EVENT):
                raise aiohttp.ClientPayloadError("the stream ended before [DONE]")
        except (aiohttp.ClientError, TimeoutError) as e:
            self._count(ex, relay)
            if lease.cut is not None:  # the gateway closed it (gateway.backends.registry.Lease)
                return self._broken(ex, lease, f"cut_{lease.cut}", _CUT_MESSAGES[lease.cut])
            self.registry.request_failed(lease.entry, "midstream")
            return self._broken(ex, lease, type(e).__name__, f"upstream stream failed: {e}")
        except asyncio.CancelledError:
            if ex.cut_reason is None:
                raise  # the client went away: nothing to tell it
            _uncancel()
            ex.midstream_error = "cut_gateway"
            await ex.end_stream(relay.fail(ex.cut_reason, 503))
            return None
        self._count(ex, relay)
        if relay.engine_error and ex.midstream_error is None:
            ex.midstream_error = "engine_error"
        await ex.end_stream(tail)
        return None

    def _broken(self, ex: Exchange, lease: Lease, error: str, message: str) -> str:
        ex.midstream_error = error
        ex.failed_urls.add(lease.entry.url)
        log.warning("stream broke after first byte", extra={"fields": {
            "request_id": ex.id, "backend": lease.entry.url, "error": error}})  # fmt: skip
        return message

    @staticmethod
    def _count(ex: Exchange, relay: StreamRelay) -> None:
        """The stream's counts, for telemetry: a continuation's relay counts the whole."""
        ex.text_events, ex.output_tokens = relay.text_events, relay.completion_tokens

    # -- continuation ----------------------------------------------------------------------
    async def _continue(self, ex: Exchange, broken: str) -> str | None:
        """Generate the rest of a broken stream elsewhere and splice it into the client's (at
        most `max_continuations` times). None once a continuation ran to the end; otherwise
        the message the stream ends with."""
        while ex.transcript is not None and ex.continuations < self.continuation.max_continuations:
            progress = replay(ex.transcript, ex.endpoint.chat)
            body = continued_body(ex.data, ex.endpoint.chat, progress)
            if body is None:
                self.telemetry.child(self.telemetry.continuations, "impossible").inc()
                return broken
            request = (ex.endpoint.path, json.dumps(body).encode())
            for backend in self._continuation_candidates(ex):
                entry = self.registry.entries[backend.url]  # just chosen among those present
                ex.attempts += 1
                with self.registry.lease(entry, ex.slo.tpot_s, ex.task) as lease:
                    try:
                        _, resp, first = await self._open(ex, lease, request, False)
                    except Retryable as e:
                        self.attempt_failed(backend, e, ex.attempts)
                        ex.failed_urls.add(backend.url)
                        continue
                    try:
                        if resp.status != 200:  # refused for good (e.g. a 400): end here
                            ex.failed_urls.add(backend.url)
                            continue
                        ex.continuations += 1
                        self.telemetry.child(self.telemetry.continuations, "continued").inc()
                        log.info("stream continued", extra={"fields": {
                            "request_id": ex.id, "backend": backend.url,
                            "tokens_before": progress.tokens, "continuation": ex.continuations,
                        }})  # fmt: skip
                        relay = SplicedRelay(entry.adapter.relay(ex), progress, ex.endpoint.chat)
                        ex.midstream_error = None
                        again = await self._relay(ex, resp, first, relay, lease)
                    finally:
                        resp.release()
                if again is None:
                    return None
                broken = again
                break  # broke again: replay what the client has now, and go on
            else:
                self.telemetry.child(self.telemetry.continuations, "failed").inc()
                return broken
        return broken

    def _continuation_candidates(self, ex: Exchange) -> list[Backend]:
        """The decision's candidates that can take the continuation: in rotation, not failed
        for this request, taking the OpenAI body as it is (the continuation's is rebuilt), its
        own tier first (the closest in speed)."""
        tier = ex.backend.role if ex.backend is not None else None
        usable = [
            b for b in ex.decision.candidates
            if b.url not in ex.failed_urls
            and (e := self.registry.entries.get(b.url)) is not None
            and e.left_at is None
            and not e.live.ejected
            and e.adapter.passthrough
        ]  # fmt: skip
        return sorted(usable, key=lambda b: b.role is not tier)

    async def _give_up(self, ex: Exchange, last: Retryable) -> None:
        headers = [(b"x-tiergate-attempts", str(ex.attempts).encode()), *ex.response_headers]
        if last.status is not None:
            # Every candidate refused: pass the last engine's answer on as it was.
            ex.status, body = last.status, last.body
            headers += [(b"content-type", b"application/json"), *last.headers]
        else:
            ex.status = 502
            why = f"{last.reason}: {last.detail}" if last.detail else last.reason
            body = error_json(502, f"no backend answered after {ex.attempts} attempt(s) "
                                   f"(last failure: {why})")  # fmt: skip
            headers.append((b"content-type", b"application/json"))
        await ex.answer(ex.status, headers, body)


class _Events:
    """A stream's pieces as the engine sent them, into whole SSE events for the client: each
    piece noted for the watchdog; its events read by the relay, their text timed, kept for a
    continuation, filtered."""

    __slots__ = (
        "clock", "ex", "filters", "held", "last", "lease", "relay", "transcript", "writer",
    )  # fmt: skip

    def __init__(self, ex: Exchange, relay: StreamRelay, lease: Lease, clock: Any) -> None:
        self.ex, self.relay, self.lease, self.clock = ex, relay, lease, clock
        self.filters, self.transcript, self.writer = ex.body_filters, ex.transcript, ex.writer
        self.held = self.last = b""  # a piece of an event not yet whole; the last events out

    def __call__(self, chunk: bytes) -> bytes:
        """What of `chunk` goes to the client now (b"": nothing yet)."""
        self.lease.last_io = now = self.clock()
        # Whole events to the relay, however the engine's bytes were cut into reads: its text
        # found and timed, its tokens and usage counted, as the client will read them.
        if self.held or not chunk.endswith(b"\n\n"):
            chunk, self.held = whole_events(self.held, chunk)
            if not chunk:
                return b""
        relay = self.relay
        out, text = relay.feed(chunk)
        if text:
            ex = self.ex
            if ex.first_text_at is None:
                ex.first_text_at = now
            ex.last_text_at = now
        if out:
            if self.transcript is not None:
                self.transcript.append(out)
            self.last = out
            if relay.carried_usage:  # the body filters are the usage's (Exchange.body_filters)
                for f in self.filters:
                    out = f(out)
        return out

    def write(self, chunk: bytes) -> bool:
        """`chunk`'s whole events to the writer (`Http1Response.pump`'s sink): True when the
        client reads slower than it is written."""
        out = self(chunk)
        return bool(out) and cast("ConnectionWriter", self.writer).chunk(out)
