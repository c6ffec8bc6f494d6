"""Intake: turn what the client sent into an `Exchange`, or a clear OpenAI error.

Authentication, the content type, the body (size-limited), JSON (too deep or too long numbers
included: 400), the fields routing needs (validated by the API's
request models), the model, the `x-tiergate-tier` pin, and the backends of kinds that cannot
serve this particular request. Every problem is a `GatewayError` with the status and the
offending `param`; nothing here talks to a backend.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from gateway.backends.registry import Registry
from gateway.config.settings import Settings
from gateway.core.api import ChatCompletionRequest, CompletionRequest
from gateway.core.errors import GatewayError, first_problem
from gateway.core.exchange import Endpoint, Exchange, Send
from gateway.pipeline.homes import Homes
from gateway.pipeline.releases import Release, Releases
from gateway.pipeline.tenants import Tenants
from gateway.pipeline.usage import ask_usage
from gateway.routing import Role, Slo
from gateway.routing.affinity import affinity_key

__all__ = ["ClientGone", "Intake", "Receive"]

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

_SCHEMAS: dict[bool, type[BaseModel]] = {False: CompletionRequest, True: ChatCompletionRequest}
# A client's x-request-id is kept when it is short and plain; any other is replaced by one of
# the gateway's, so that it cannot forge fields in a log line or a header downstream.
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_JSON = b"application/json"


class ClientGone(asyncio.CancelledError):
    """The client went away before its request was read whole: the work for it stops, as if
    cancelled, and the proxy tells it apart from a real cancellation."""


class Intake:
    def __init__(
        self, settings: Settings, registry: Registry, releases: Releases | None = None
    ) -> None:
        self.registry = registry
        self.releases = Releases(settings.releases) if releases is None else releases
        self.slo = settings.slo.slo()
        self.max_body = settings.max_body_bytes
        self.tenants = Tenants(settings)
        self.priorities = settings.priorities and bool(settings.tenants)
        # Affinity keys matter only where there are several backends to choose from (or
        # discovery may add them); where they do, the memory of where each was served.
        policy = settings.policy
        keyed = policy.prefix_affinity and (
            len(registry.backends) > 1 or any(t.discovery for t in settings.tiers)
        )
        quiet = (policy.affinity_quiet_after, policy.affinity_quiet_every)
        self.homes = (
            Homes(policy.affinity_keys, policy.affinity_ttl_s, quiet=quiet) if keyed else None
        )
        # Request ids: a per-process random prefix and a counter; unique, and far cheaper
        # than uuid4 per request.
        self._rid_prefix = uuid.uuid4().hex[:16]
        self._rid_counter: Iterator[int] = itertools.count()

    def new_id(self) -> str:
        return f"{self._rid_prefix}{next(self._rid_counter):08x}"

    def open(self, endpoint: Endpoint, scope: MutableMapping[str, Any], send: Send) -> Exchange:
        """The exchange for a request that just arrived (headers only, nothing read yet)."""
        headers: dict[bytes, bytes] = dict(scope["headers"])
        sent = headers.get(b"x-request-id")
        if sent is not None and _REQUEST_ID.fullmatch(sent):
            rid = sent.decode("ascii")
        else:
            rid = self.new_id()
            headers[b"x-request-id"] = rid.encode("ascii")
        return Exchange(rid, endpoint, headers, send, time.perf_counter())

    async def read(self, ex: Exchange, receive: Receive) -> None:
        """Fill in what the client asked for; a GatewayError if it cannot be served as sent."""
        tenant = self.tenants.identify(ex.headers.get(b"authorization"))
        if tenant is None:
            raise GatewayError(401, "Missing or invalid API key (Authorization: Bearer ...).")
        ex.tenant = tenant
        ctype = ex.headers.get(b"content-type")
        if ctype and not _is_json(ctype):  # an empty header counts as none
            raise GatewayError(
                415, "The body must be JSON, sent with Content-Type: application/json "
                "(curl: -H 'Content-Type: application/json').", "content-type",
            )  # fmt: skip
        ex.body = await self._body(ex, receive)
        try:
            # pydantic-core's parser first: one call, 5,000 instructions for a small body
            # against json.loads' 22,900 (docs/results/instructions-request-path). What it
            # refuses (nested past 200, a lone surrogate, UTF-16, a malformed body) goes to
            # json.loads, whose answer or error stands: where both accept a body they give the
            # same objects.
            data = from_json(ex.body)
        except ValueError:
            data = _json(ex.body)
        if not isinstance(data, dict):
            raise GatewayError(400, "The request body must be a JSON object.")
        try:
            parsed = _SCHEMAS[ex.endpoint.chat].model_validate(data)
        except ValidationError as e:
            raise GatewayError(400, *first_problem(e.errors())) from None
        ex.data = data
        ex.stream = bool(getattr(parsed, "stream", False))
        model = getattr(parsed, "model", None)
        releases = self.releases.table
        release = releases.get(model) if releases and model is not None else None
        if release is None:
            ex.model = self._model(model)
        else:
            self._release(ex, release)
        if tenant.models and model not in tenant.models and ex.model not in tenant.models:
            raise GatewayError(
                403, f"This API key may not use the model `{model or ex.model}`.", "model"
            )
        ex.pinned = self._pin(ex.headers.get(b"x-tiergate-tier"))
        if self.priorities:
            ex.priority = 1 - tenant.rank  # interactive -1, standard 0, batch 1
            # Batch work leaves the latency tier to interactive work: the pool, or wait.
            batch = tenant.rank <= 0 and ex.pinned is None
            if batch and self.registry.serving(ex.model, Role.THROUGHPUT):
                ex.pinned = Role.THROUGHPUT
        ex.slo = self._slo(ex.headers, tenant.slo)
        homes = self.homes
        if homes is not None:
            # (`caller`, spelled out for the common case of no session: every request)
            sid, user = ex.headers.get(b"x-session-id"), data.get("user")
            if sid or (user and isinstance(user, str)):
                ex.session = True
                ex.affinity = session_key(
                    (b"session", sid) if sid else (b"user", str(user).encode())
                )
            elif next(homes.draw):
                ex.affinity = prefix_key(data, ex.endpoint.chat)
            elif len(ex.body) >= _LATER_BODY[ex.endpoint.chat] and later_turn(
                data, ex.endpoint.chat
            ):
                # Quiet (prompts never repeat: gateway.pipeline.homes): a request not drawn is
                # not keyed, no key computed, unless it may be a conversation's later turn,
                # whose earlier turn may have been drawn. (A completion's body too short to
                # hold one is not asked: the call costs more than the rest of the check.)
                key = prefix_key(data, ex.endpoint.chat)
                if key is not None and key in homes:
                    ex.affinity = key
        if self.registry.restricted:
            ex.exclude = self._exclusions(ex)
        ask_usage(ex)  # a stream counted in tokens, not events (gateway.pipeline.usage)

    async def _body(self, ex: Exchange, receive: Receive) -> bytes:
        declared = ex.headers.get(b"content-length")
        if declared and declared.isdigit() and (size := int(declared)) > self.max_body:
            raise GatewayError(
                413, f"Request body of {size} bytes exceeds the {self.max_body}-byte limit."
            )
        parts: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise GatewayError(413, f"Request body exceeds the {self.max_body}-byte limit.")
            parts.append(chunk)
            if not msg.get("more_body"):
                return b"".join(parts)

    def _model(self, model: str | None) -> str:
        models = self.registry.models
        if model is None:
            if len(models) != 1:
                raise GatewayError(400, "model is required.", "model")
            (model,) = models
        elif model not in models:
            raise GatewayError(404, f"The model `{model}` does not exist.", "model")
        return model

    def _release(self, ex: Exchange, release: Release) -> None:
        """Put `ex` on a variant of `release`: sticky by its session or user, if it has one.
        The body names the variant's model, since that is what its backends serve."""
        who = caller(ex.headers.get(b"x-session-id"), ex.data)
        ex.variant, ex.mirror = self.releases.choose(release, None if who is None else who[1])
        ex.model = ex.variant.model
        if ex.model != release.model:
            ex.set_field("model", ex.model)

    @staticmethod
    def _pin(value: bytes | None) -> Role | None:
        if not value:
            return None
        try:
            return Role(value.decode("latin-1").strip().lower())
        except ValueError:
            raise GatewayError(
                400, "x-tiergate-tier must be `latency` or `throughput`.", "x-tiergate-tier"
            ) from None

    def _slo(self, headers: dict[bytes, bytes], default: Slo | None) -> Slo:
        """The request's SLO: its headers', else its tenant's, else the gateway's."""
        base = default or self.slo
        ttft = headers.get(b"x-tiergate-slo-ttft-ms")
        tpot = headers.get(b"x-tiergate-slo-tpot-ms")
        if ttft is None and tpot is None:
            return base
        return Slo(
            ttft_s=base.ttft_s if ttft is None else _ms(ttft, "x-tiergate-slo-ttft-ms"),
            tpot_s=base.tpot_s if tpot is None else _ms(tpot, "x-tiergate-slo-tpot-ms"),
        )

    def _exclusions(self, ex: Exchange) -> frozenset[str]:
        """Backends of kinds that cannot serve this request (Triton: chat, token-id prompts,
        n > 1, logprobs...). A 400 saying why when no other backend could ever serve it."""
        excluded: set[str] = set()
        for wire, urls in self.registry.restricted:
            why = wire.incompatibility(ex)
            if why is None:
                continue
            excluded |= urls
            if not self.registry.serving(ex.model, ex.pinned) - excluded:
                where = f" in the {ex.pinned.value} tier" if ex.pinned else ""
                raise GatewayError(
                    400, f"{why.message}. Every backend serving `{ex.model}`{where} is "
                    f"{wire.label}.", why.param,
                )  # fmt: skip
        return frozenset(excluded)


# How much of a prompt names its prefix: a few of the engine's 16-token cache blocks.
_PREFIX_CHARS = 1024
_PREFIX_IDS = 256
# The shortest body that may hold a later turn (`later_turn`), by endpoint (chat or not): a
# completion's prompt of _PREFIX_IDS token ids or more (a digit and a comma each, at least), or
# of _PREFIX_CHARS characters (a byte each, at least), or a batch of _PREFIX_IDS prompts.
_LATER_BODY = {False: 2 * _PREFIX_IDS - 1, True: 0}


def caller(session: bytes | None, data: dict[str, Any]) -> tuple[bytes, bytes] | None:
    """Who sends the request, when it says: ("session", its `x-session-id` header), else
    ("user", its `user` field); what sticks it to an instance (affinity) or a variant (gray
    releases)."""
    if session:
        return b"session", session
    user = data.get("user")
    if isinstance(user, str) and user:
        return b"user", user.encode()
    return None


def affinity_of(session: bytes | None, data: dict[str, Any], chat: bool) -> int | None:
    """The request's prefix-cache affinity key: its `x-session-id` header, else its `user`
    field (`session_key`), else what its conversation shares with its later turns or its
    prompt's beginning (`prefix_key`). None when the request has nothing to key on."""
    who = caller(session, data)
    return session_key(who) if who else prefix_key(data, chat)


def session_key(who: tuple[bytes, bytes]) -> int:
    """A declared session's key, the same in every process (blake2b): it picks its instance by
    rendezvous hashing, alike in every replica and worker."""
    return affinity_key(who[0] + b":" + who[1])


def prefix_key(data: dict[str, Any], chat: bool) -> int | None:
    """What a conversation shares with its later turns (a chat's messages up to its first user
    message: the system prompt and the question that opened it) or a prompt's beginning; None
    when there is nothing to key on.

    Such a key only keys this process's memory of where it was served (gateway.pipeline.homes),
    so Python's own hash, salted per process, does: a tenth of blake2b's cost, on every
    request."""
    if chat:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        opening = next((i for i, m in enumerate(messages)
                        if isinstance(m, dict) and m.get("role") == "user"), 0)  # fmt: skip
        head = json.dumps(messages[: opening + 1], sort_keys=True, separators=(",", ":"))
        return hash(("chat", head))
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch: its first prompt
    if isinstance(prompt, str) and prompt:
        return hash(("prompt", prompt[:_PREFIX_CHARS]))
    if isinstance(prompt, list) and prompt:
        return hash(("ids", repr(prompt[:_PREFIX_IDS])))
    return None


def later_turn(data: dict[str, Any], chat: bool) -> bool:
    """Whether the request may be a later turn of a conversation: a chat that carries more than
    its opening (a system prompt and the first question); a prompt long enough that its key
    (`prefix_key`: its beginning) is shared by the longer prompts of the turns after it, where
    a shorter prompt's key is the whole prompt and only its exact repeat has it. Cheap and
    generous: a first turn with few-shot examples, a long one-off prompt, counts too, and is
    only looked up."""
    if chat:
        messages = data.get("messages")
        return isinstance(messages, list) and len(messages) > 2
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return len(prompt) >= _PREFIX_CHARS
    return isinstance(prompt, list) and len(prompt) >= _PREFIX_IDS


def _json(body: bytes) -> Any:
    """`body` as json.loads reads it; a GatewayError (400) saying why where it cannot."""
    try:
        return json.loads(body)
    except RecursionError:
        raise GatewayError(400, "Malformed JSON body: nested too deeply.") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        # Python refuses integers of more than 4,300 digits with a plain ValueError.
        why = str(e) if isinstance(e, json.JSONDecodeError | UnicodeDecodeError) else (
            "a number has too many digits")  # fmt: skip
        raise GatewayError(400, f"Malformed JSON body: {why}") from None


def _is_json(ctype: bytes) -> bool:
    """application/json, with parameters (charset) or not, in any case.

    No content type at all is taken as JSON, as vLLM's FastAPI does (Python's `requests` with
    `data=` sends none). Every other type is refused with 415, form encoding included (what
    `curl -d` sends without -H): vLLM refuses those bodies too (422), and the types a browser
    may send cross-site without asking first (forms, text/plain) cannot reach the engines."""
    head = ctype[:16].lower()
    return head == _JSON and (len(ctype) == 16 or ctype[16:17] in b"; \t")


def _ms(value: bytes, header: str) -> float:
    """A header's milliseconds as seconds: a positive number up to an hour."""
    try:
        ms = float(value.decode("latin-1").strip())
    except ValueError:
        ms = math.nan
    if not 0 < ms <= 3_600_000:  # also false for NaN
        raise GatewayError(400, f"{header} must be a number of milliseconds in (0, 3600000].",
                           header)  # fmt: skip
    return ms / 1000
