"""Intake against careless and hostile requests, without sockets: content types, JSON that
Python's parser refuses in ways of its own (depth, digits), request ids that could forge a log
line, and a client gone mid-body (tests/integration/test_hostile_input.py: the same over real
sockets, and what the HTTP server itself refuses)."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from gateway.backends.registry import Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.core.errors import GatewayError
from gateway.core.exchange import Endpoint, Exchange
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.intake import ClientGone, Intake

COMPLETIONS = Endpoint("/v1/completions", chat=False)
OKAY = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}).encode()


def intake() -> Intake:
    s = Settings(tiers=[{"name": "t", "role": "throughput",
                         "backends": [{"url": "http://t:1", "models": ["m"]}]}])  # fmt: skip
    return Intake(s, Registry(s, MemoryInflightStore(), Telemetry()))


async def _no_send(message: MutableMapping[str, Any]) -> None:
    raise AssertionError("intake sends nothing")


def opened(it: Intake, headers: list[tuple[bytes, bytes]]) -> Exchange:
    return it.open(COMPLETIONS, {"headers": headers}, _no_send)


async def read(body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> Exchange:
    it = intake()
    ex = opened(it, headers or [])
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    await it.read(ex, receive)
    return ex


@pytest.mark.parametrize(
    "ctype",
    [b"application/json", b"application/json; charset=utf-8", b"APPLICATION/JSON;charset=UTF-8",
     b"application/json ", b""],
)  # fmt: skip
async def test_json_content_types_and_none_are_taken(ctype: bytes) -> None:
    ex = await read(OKAY, [(b"content-type", ctype)] if ctype else [])
    assert ex.model == "m"


@pytest.mark.parametrize(
    "ctype",
    [b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x",
     b"application/jsonp", b"application/octet-stream"],
)  # fmt: skip
async def test_other_content_types_are_415(ctype: bytes) -> None:
    with pytest.raises(GatewayError) as err:
        await read(OKAY, [(b"content-type", ctype)])
    assert (err.value.status, err.value.param) == (415, "content-type")


@pytest.mark.parametrize(
    ("body", "says"),
    [(b"[" * 10_000 + b"]" * 10_000, "nested too deeply"),
     (b'{"model": "m", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
     (b'{"model": "m", "prompt": "hi", "max_tokens": ' + b"7" * 5000 + b"}", "too many digits"),
     (b'{"model": "m", "prompt": "\xff"}', "Malformed JSON"),
     (b'{"model": "m"', "Malformed JSON")],
)  # fmt: skip
async def test_json_python_cannot_take_is_400(body: bytes, says: str) -> None:
    with pytest.raises(GatewayError) as err:
        await read(body)
    assert err.value.status == 400
    assert says in err.value.message


# Bodies read first by pydantic-core's parser, then by json.loads where it refuses them: what
# either gives must be what json.loads alone gives.
_VALUES = [b"1e400", b"-1e400", b"123456789012345678901234567890", b"-0", b"-0.0", b"5e-324",
           b"1.7976931348623157e308", b"0.1", b"2.5E+3", b'"\\u00e9"', b'"\\ud83d\\ude00"',
           b'{"a": 1, "a": 2}', b"[1, 2 ]", b" {} ", b'"\\/"', b'"a\\u0000b"', b"NaN",
           b"-Infinity", b'"\xc3\xa9"', b'"\\ud800"', b'"\xed\xa0\x80"', b'{"": null}',
           b"[" * 300 + b"]" * 300]  # fmt: skip
_WHOLE = '{"model": "m", "prompt": "hi", "x": 1}'


@pytest.mark.parametrize(
    "body",
    [*(b'{"model": "m", "prompt": "hi", "x": ' + v + b"}" for v in _VALUES),
     _WHOLE.encode("utf-16"), _WHOLE.encode("utf-32"), b"\xef\xbb\xbf" + _WHOLE.encode()],
)  # fmt: skip
async def test_a_body_reads_as_json_loads_reads_it(body: bytes) -> None:
    """Floats at their limits, big integers, escapes, duplicate keys, NaN, lone surrogates,
    nesting past pydantic-core's 200, UTF-16, UTF-32 and a byte-order mark: each as json.loads
    has it (the parser tried first refuses the lone surrogates and the last four)."""
    ex = await read(body)
    assert repr(ex.data) == repr(json.loads(body))


@pytest.mark.parametrize(
    "rid",
    [b"a b", b"x" * 129, b'id" request_id=forged', b"line\nbreak", "ünï".encode(), b"",
     b"tab\there"],
)  # fmt: skip
def test_a_request_id_that_could_forge_a_log_is_replaced(rid: bytes) -> None:
    it = intake()
    ex = opened(it, [(b"x-request-id", rid)])
    assert ex.id != rid.decode("latin-1")
    assert len(ex.id) == 24
    assert ex.headers[b"x-request-id"] == ex.id.encode()  # what the engine sees too


@pytest.mark.parametrize("rid", [b"abc", b"0f3c9a1e-7d2b-4c55-9e0a-1b2c3d4e5f60", b"A.b:c_d-" * 14])
def test_a_plain_request_id_is_kept(rid: bytes) -> None:
    ex = opened(intake(), [(b"x-request-id", rid)])
    assert ex.id == rid.decode()
    assert ex.headers[b"x-request-id"] == rid


async def test_a_client_gone_mid_body_is_client_gone() -> None:
    it = intake()
    ex = opened(it, [])
    messages = [{"type": "http.request", "body": b'{"mod', "more_body": True},
                {"type": "http.disconnect"}]  # fmt: skip

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    with pytest.raises(ClientGone):
        await it.read(ex, receive)
