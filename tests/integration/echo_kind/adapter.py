"""The echo kind's wire adapter: an OpenAI completion to the echo engine's generate call and
its answer back; streams and chat are not the echo engine's to serve."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.core.errors import error_json
from gateway.wire import Incompatible
from gateway.wire.metrics import EngineStats, collect

if TYPE_CHECKING:
    from gateway.core.exchange import Exchange

__all__ = ["ADAPTER"]

_SERIES: Mapping[str, str] = {"echo_queue": "waiting", "echo_busy": "running"}
_ONLY_WHOLE = Incompatible("stream", "The echo engine answers whole completions only")
_NO_CHAT = Incompatible(None, "The echo engine has no chat template; send /v1/completions")


class _NoRelay:
    text_events = 0
    completion_tokens: int | None = None
    engine_error = False
    carried_usage = False

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        raise AssertionError("the echo kind refuses streams")

    def close(self) -> bytes:
        return b""

    def fail(self, message: str, status: int = 502) -> bytes:
        return b""


class EchoAdapter:
    kind = "echo"
    label = "Echo"
    # Not served by the echo engine: its readiness check (readiness.py) probes it instead.
    health_path = "/no-such-path"
    metrics_query = ""
    restricts = True
    passthrough = False
    ambiguous: frozenset[int] = frozenset()

    def parse_metrics(self, text: str) -> Mapping[str, EngineStats]:
        return collect(text, _SERIES, "model")

    def incompatibility(self, ex: Exchange) -> Incompatible | None:
        if ex.endpoint.chat:
            return _NO_CHAT
        return _ONLY_WHOLE if ex.stream else None

    def request(self, ex: Exchange, options: Any) -> tuple[str, bytes]:
        prompt = ex.data.get("prompt")
        body = {"model": ex.model, "prompt": options.echo_prefix + str(prompt),
                "n": int(ex.data.get("max_tokens") or 16)}  # fmt: skip
        return "/echo/generate", json.dumps(body).encode()

    def reply(
        self, ex: Exchange, status: int, body: bytes, content_type: bytes
    ) -> tuple[int, bytes, bytes]:
        if status != 200:
            why = error_json(status, f"the echo engine answered {status}")
            return status, why, b"application/json"
        answer = json.loads(body)
        out = {"id": f"cmpl-{ex.id}", "object": "text_completion", "created": int(time.time()),
               "model": ex.model,
               "choices": [{"index": 0, "text": answer["output"], "logprobs": None,
                            "finish_reason": "length"}],
               "usage": {"prompt_tokens": 0, "completion_tokens": answer["tokens"],
                         "total_tokens": answer["tokens"]}}  # fmt: skip
        return 200, json.dumps(out).encode(), b"application/json"

    def refused(self, status: int, body: bytes) -> bytes:
        return error_json(status, "the echo engine is busy")

    def early_error(self, first: bytes) -> tuple[int, bytes] | None:
        return None

    def relay(self, ex: Exchange) -> _NoRelay:
        return _NoRelay()


ADAPTER = EchoAdapter()
