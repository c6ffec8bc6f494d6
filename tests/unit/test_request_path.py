"""The request object's path without sockets: intake fills an Exchange or refuses with an
OpenAI error, admission decides (holding saturated requests until capacity frees), and the vLLM
relay counts what passes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from gateway.backends.registry import ChangeSignal, Registry
from gateway.backends.state import MemoryInflightStore
from gateway.config.settings import Settings
from gateway.core.errors import GatewayError
from gateway.core.exchange import Endpoint, Exchange
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.admission import Admission, Queueing
from gateway.pipeline.intake import Intake
from gateway.routing import Backend, Decision, Reason, Role, RouteRequest, RouterState
from gateway.wire.vllm.adapter import VllmRelay, completion_tokens, has_text

COMPLETIONS = Endpoint("/v1/completions", chat=False)
CHAT = Endpoint("/v1/chat/completions", chat=True)
LAT, T1, TRITON = "http://lat:1", "http://t1:1", "http://tr:1"


def settings(*, triton: bool = False, only_triton: bool = False, **extra: Any) -> Settings:
    pool = [{"url": TRITON, "models": ["m"], "kind": "triton"}] if triton else []
    if not only_triton:
        pool.insert(0, {"url": T1, "models": ["m"]})
    tiers = [{"name": "awq", "role": "throughput", "backends": pool}]
    if not only_triton:
        tiers.insert(0, {"name": "eagle", "role": "latency",
                         "backends": [{"url": LAT, "models": ["m"]}]})  # fmt: skip
    return Settings(tiers=tiers, **extra)


def intake(s: Settings) -> Intake:
    return Intake(s, Registry(s, MemoryInflightStore(), Telemetry()))


async def _no_send(message: MutableMapping[str, Any]) -> None:
    raise AssertionError("intake sends nothing")


def receiver(*chunks: bytes) -> Any:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]  # fmt: skip

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


def scope(headers: dict[str, str]) -> dict[str, Any]:
    return {"headers": [(k.encode(), v.encode()) for k, v in headers.items()]}


async def read(s: Settings, body: bytes | dict[str, Any], endpoint: Endpoint = COMPLETIONS,
               headers: dict[str, str] | None = None, chunks: int = 1) -> Exchange:  # fmt: skip
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    step = max(1, len(raw) // chunks)
    parts = [raw[i : i + step] for i in range(0, len(raw), step)] or [b""]
    it = intake(s)
    ex = it.open(endpoint, scope(headers or {}), _no_send)
    await it.read(ex, receiver(*parts))
    return ex


OKAY = {"model": "m", "prompt": "hi", "max_tokens": 4}

# -- intake: refusals --------------------------------------------------------------------------

REFUSALS: list[tuple[str, Any, dict[str, Any], int, str | None]] = [
    ("unknown model", OKAY | {"model": "gpt-9"}, {}, 404, "model"),
    ("malformed JSON", b"{bad", {}, 400, None),
    ("not an object", b"[1, 2]", {}, 400, None),
    ("no prompt", {"model": "m"}, {}, 400, "prompt"),
    ("max_tokens type", OKAY | {"max_tokens": "many"}, {}, 400, "max_tokens"),
    ("max_tokens zero", OKAY | {"max_tokens": 0}, {}, 400, "max_tokens"),
    ("stream_options without stream", OKAY | {"stream_options": {"include_usage": True}}, {},
     400, None),
    ("declared body too large", OKAY, {"content-length": "2000000"}, 413, None),
    ("bad pin", OKAY, {"x-tiergate-tier": "fastest"}, 400, "x-tiergate-tier"),
    ("missing key", OKAY, {"authorization": "Bearer nope"}, 401, None),
]  # fmt: skip


@pytest.mark.parametrize(("body", "headers", "status", "param"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])  # fmt: skip
async def test_intake_refuses_with_the_status_and_param(
    body: Any, headers: dict[str, str], status: int, param: str | None
) -> None:
    s = settings(api_keys=["sekret"] if status == 401 else [])
    if status != 401 and s.api_keys:
        headers = headers | {"authorization": "Bearer sekret"}
    with pytest.raises(GatewayError) as err:
        await read(s, body, headers=headers)
    assert (err.value.status, err.value.param) == (status, param)
    got = json.loads(err.value.body())["error"]
    assert set(got) == {"message", "type", "param", "code"}
    assert got["code"] == status


async def test_a_streamed_body_over_the_limit_is_413_before_it_is_all_read() -> None:
    s = settings(max_body_bytes=100)
    big = json.dumps(OKAY | {"prompt": "x " * 200}).encode()
    with pytest.raises(GatewayError) as err:
        await read(s, big, chunks=8)
    assert err.value.status == 413


async def test_a_client_gone_while_sending_the_body_cancels() -> None:
    it = intake(settings())
    ex = it.open(COMPLETIONS, scope({}), _no_send)
    messages = [{"type": "http.request", "body": b'{"mod', "more_body": True},
                {"type": "http.disconnect"}]  # fmt: skip

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    with pytest.raises(asyncio.CancelledError):
        await it.read(ex, receive)


# -- intake: what it fills in ------------------------------------------------------------------


async def test_intake_fills_the_exchange() -> None:
    body = OKAY | {"stream": True, "ignore_eos": True, "priority": 2}
    ex = await read(settings(), body, headers={"x-tiergate-tier": " Latency ",
                                               "x-request-id": "abc"})  # fmt: skip
    assert (ex.id, ex.model, ex.stream, ex.pinned) == ("abc", "m", True, Role.LATENCY)
    # Forwarded as it came, asking for usage (streams count tokens: gateway.pipeline.usage).
    assert ex.data == json.loads(ex.body) == body | {"stream_options": {"include_usage": True}}
    assert ex.exclude == frozenset()
    assert ex.response_headers == [(b"x-request-id", b"abc")]
    # Prefix affinity is on by default: the prompt's beginning keys it (not a session).
    assert ex.affinity is not None
    assert ex.route_request() == RouteRequest("m", Role.LATENCY, True, frozenset(),
                                              affinity=ex.affinity)  # fmt: skip


@pytest.mark.parametrize(
    ("case", "limit", "home", "prompt_tokens", "max_tokens"),
    [
        ("a home: the body's size and the answer's limit", {"max_tokens": 24}, True, True, 24),
        ("a chat's limit by its newer name", {"max_completion_tokens": 7}, True, True, 7),
        ("no limit given", {}, True, True, 0),
        ("a limit that is no count", {"max_tokens": "24"}, True, True, 0),
        ("no home: neither read", {"max_tokens": 24}, False, False, 0),
    ],
)
def test_a_request_with_a_home_tells_routing_what_a_move_would_prefill(
    case: str, limit: dict[str, Any], home: bool, prompt_tokens: bool, max_tokens: int
) -> None:
    ex = exchange()
    ex.data, ex.body = {"prompt": "word " * 100, **limit}, b"x" * 600
    ex.affinity, ex.home = 1, ("http://home:1" if home else None)
    req = ex.route_request()
    assert (req.prompt_tokens, req.max_tokens) == ((150 if prompt_tokens else 0), max_tokens), case
    assert req.home == ex.home


async def test_prompts_that_never_repeat_stop_being_keyed_and_a_repeat_keys_them_again() -> None:
    """Past `affinity_quiet_after` new keys in a row (none served again), most requests carry
    no affinity key (no bookkeeping: gateway.pipeline.homes); a session always does, a chat's
    later turn, and a prompt long enough to share its key's beginning with an earlier one, are
    looked up and keyed where remembered, a short repeated prompt where it is drawn, and a
    remembered key that comes again turns keying back on for every request."""
    s = settings(policy={"affinity_quiet_after": 16, "affinity_quiet_every": 4})
    it = intake(s)
    homes = it.homes
    assert homes is not None

    async def one(body: dict[str, Any], headers: dict[str, str] | None = None) -> Exchange:
        endpoint = CHAT if "messages" in body else COMPLETIONS
        ex = it.open(endpoint, scope(headers or {}), _no_send)
        await it.read(ex, receiver(json.dumps(body).encode()))
        if ex.affinity is not None:  # as the proxy does around routing (gateway.serve.app)
            homes.begin(ex)
            homes.end(ex)
        return ex

    def prompt(text: str) -> dict[str, Any]:
        return OKAY | {"prompt": text}

    def chat(*turns: str) -> dict[str, Any]:
        said = [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                for i, t in enumerate(turns)]  # fmt: skip
        return {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, *said]}

    opening = "A long opening of a conversation. " * 40  # past the key's 1,024 characters
    assert (await one(chat("a chat"))).affinity is not None
    assert (await one(prompt(opening))).affinity is not None
    for i in range(14):
        assert (await one(prompt(f"new {i}"))).affinity is not None
    quiet = [(await one(prompt(f"quiet {i}"))).affinity is not None for i in range(400)]
    assert not homes.everyone
    assert 50 <= sum(quiet) <= 150  # about one in four
    firsts = [(await one(chat(f"quiet chat {i}"))).affinity is not None for i in range(400)]
    assert 50 <= sum(firsts) <= 150  # a first turn shows nothing to look up: drawn
    assert (await one(prompt("a session"), {"x-session-id": "s1"})).affinity is not None
    # A later turn of a chat remembered before it went quiet: looked up, keyed, every key again.
    assert (await one(chat("a chat", "yes", "and then"))).affinity is not None
    assert homes.everyone
    for i in range(16):
        await one(prompt(f"once more new {i}"))
    assert not homes.everyone
    # A prompt whose beginning is a remembered key's (a completion conversation's later turn,
    # its opening past the key's length): looked up, keyed, every key again.
    assert (await one(prompt(opening + "An answer. A second question."))).affinity is not None
    assert homes.everyone
    for i in range(16):
        await one(prompt(f"again new {i}"))
    assert not homes.everyone
    # A completion shows no turns: its repeat is keyed where it is drawn (one in four).
    kept = prompt(f"quiet {quiet.index(True)}")
    for _ in range(100):  # none of 100 drawn: 0.75^100, 3e-13
        if (await one(kept)).affinity is not None:
            break
    assert homes.everyone
    assert all([(await one(prompt(f"after {i}"))).affinity is not None for i in range(10)])


async def test_request_ids_are_made_when_absent_and_unique() -> None:
    it = intake(settings())
    ids = {it.open(COMPLETIONS, scope({}), _no_send).id for _ in range(1000)}
    assert len(ids) == 1000
    ex = it.open(COMPLETIONS, scope({}), _no_send)
    assert ex.headers[b"x-request-id"] == ex.id.encode()


async def test_the_model_may_be_left_out_when_there_is_one() -> None:
    ex = await read(settings(), {"prompt": "hi"})
    assert ex.model == "m"


TRITON_CASES: list[tuple[str, dict[str, Any], Endpoint, bool, frozenset[str] | int]] = [
    ("plain completion: Triton may serve it", OKAY, COMPLETIONS, False, frozenset()),
    ("chat: not Triton", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, CHAT,
     False, frozenset({TRITON})),
    ("token ids: not Triton", OKAY | {"prompt": [1, 2]}, COMPLETIONS, False,
     frozenset({TRITON})),
    ("n=2: not Triton", OKAY | {"n": 2}, COMPLETIONS, False, frozenset({TRITON})),
    ("chat with only Triton: 400", {"model": "m", "messages": [{"role": "user", "content": "x"}]},
     CHAT, True, 400),
    ("logprobs with only Triton: 400", OKAY | {"logprobs": 2}, COMPLETIONS, True, 400),
]  # fmt: skip


@pytest.mark.parametrize(("body", "endpoint", "only", "expected"), [c[1:] for c in TRITON_CASES],
                         ids=[c[0] for c in TRITON_CASES])  # fmt: skip
async def test_requests_a_kind_cannot_take_avoid_its_backends(
    body: dict[str, Any], endpoint: Endpoint, only: bool, expected: frozenset[str] | int
) -> None:
    s = settings(triton=True, only_triton=only)
    if isinstance(expected, int):
        with pytest.raises(GatewayError) as err:
            await read(s, body, endpoint)
        assert err.value.status == expected
        assert "is Triton" in err.value.message
    else:
        assert (await read(s, body, endpoint)).exclude == expected


async def test_a_pin_to_a_tier_of_only_triton_backends_is_judged_within_it() -> None:
    s = settings(triton=True)  # latency: vLLM; throughput: vLLM + Triton
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    ex = await read(s, chat, CHAT, headers={"x-tiergate-tier": "throughput"})
    assert ex.exclude == {TRITON}


# -- admission ---------------------------------------------------------------------------------

B = Backend(T1, "awq", Role.THROUGHPUT, frozenset({"m"}))


def decision(reason: str, *candidates: Backend) -> Decision:
    return Decision(candidates, reason, "test-policy", RouterState())


class Decider:
    def __init__(self, *answers: Decision) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, req: RouteRequest) -> Decision:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def exchange() -> Exchange:
    return Exchange("rid", COMPLETIONS, {}, _no_send, 0.0, model="m")


async def test_admission_passes_a_decision_with_room_at_once() -> None:
    decide = Decider(decision(Reason.LEAST_LOADED, B))
    ex = exchange()
    got = await Admission(decide, ChangeSignal(), Queueing(5.0), Telemetry()).admit(ex)
    assert got.candidates == (B,)
    assert ex.decision is got
    assert decide.calls == 1


async def test_a_saturated_request_waits_for_capacity_then_goes() -> None:
    signal = ChangeSignal()
    decide = Decider(decision(Reason.SATURATED, B), decision(Reason.SATURATED, B),
                     decision(Reason.LEAST_LOADED, B))  # fmt: skip
    t = Telemetry()
    task = asyncio.create_task(Admission(decide, signal, Queueing(30.0), t).admit(exchange()))
    await asyncio.sleep(0)
    assert signal.waiting == 1
    assert t.queued._value.get() == 1
    signal.notify()  # capacity changed, but still saturated: back to waiting
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not task.done()
    assert signal.waiting == 1
    signal.notify()
    got = await asyncio.wait_for(task, 1.0)  # woken, not polled: no sleeping involved
    assert got.reason == Reason.LEAST_LOADED
    assert decide.calls == 3
    assert t.queued._value.get() == 0


async def test_still_saturated_at_the_deadline_is_429_with_retry_after() -> None:
    decide = Decider(decision(Reason.SATURATED, B))
    with pytest.raises(GatewayError) as err:
        await Admission(decide, ChangeSignal(), Queueing(0.02), Telemetry()).admit(exchange())
    assert err.value.status == 429
    assert err.value.headers == [(b"retry-after", b"1")]
    assert err.value.reason == "saturated"


async def test_no_deadline_means_429_at_once() -> None:
    decide = Decider(decision(Reason.SATURATED, B))
    with pytest.raises(GatewayError):
        await Admission(decide, ChangeSignal(), Queueing(0.0), Telemetry()).admit(exchange())
    assert decide.calls == 1


async def test_no_backend_is_503() -> None:
    decide = Decider(decision(Reason.NO_BACKEND))
    with pytest.raises(GatewayError) as err:
        await Admission(decide, ChangeSignal(), Queueing(5.0), Telemetry()).admit(exchange())
    assert (err.value.status, err.value.reason) == (503, "no_backend")


# -- the vLLM relay ----------------------------------------------------------------------------

CHUNK = b'data: {"id":"c","choices":[{"index":0,"text":" word","finish_reason":null}]}\n\n'
EMPTY = b'data: {"id":"c","choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\n'
CHAT_CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
USAGE = (b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":17,'
         b'"total_tokens":20}}\n\ndata: [DONE]\n\n')  # fmt: skip
ERROR = b'data: {"error": {"message": "boom", "type": "x", "param": null, "code": 500}}\n\n'


@pytest.mark.parametrize(
    ("chunk", "text", "tokens"),
    [(CHUNK, True, None), (EMPTY, False, None), (CHAT_CHUNK, True, None), (USAGE, False, 17),
     (CHUNK + CHUNK, True, None), (b"", False, None),
     # JSON's whitespace around the colon (Python's json.dumps writes `"text": "..."`)
     (b'data: {"choices": [{"text": " word"}]}\n\n', True, None),
     (b'data: {"choices":[{"text" :\t" word"}]}\n\n', True, None),
     (b'data: {"choices": [{"text": ""}]}\n\n', False, None),
     (b'data: {"choices": [{"delta": {"content": null}}]}\n\n', False, None),
     (b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', True, None),
     (b'data: {"note": "text", "choices": [{"text": "x"}]}\n\n', True, None),
     (b'data: {"choices": [], "usage": {"completion_tokens": 17}}\n\n', False, 17),
     # a reasoning model's reasoning and a tool call's arguments are generated tokens too
     (b'data: {"choices":[{"delta":{"reasoning":"Hm"}}]}\n\n', True, None),
     (b'data: {"choices":[{"delta":{"reasoning_content":"Hm"}}]}\n\n', True, None),
     (b'data: {"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\\""}}]}}]}\n\n',
      True, None),
     (b'data: {"choices":[{"delta":{"tool_calls":[{"function":{"name":"f","arguments":""}}]}}]}'
      b'\n\n', False, None)],
)  # fmt: skip
def test_what_a_chunk_carries(chunk: bytes, text: bool, tokens: int | None) -> None:
    assert has_text(chunk) is text
    assert completion_tokens(chunk) == tokens


def test_the_relay_passes_bytes_through_and_counts() -> None:
    relay = VllmRelay()
    out = [relay.feed(c) for c in (CHUNK, CHUNK + CHUNK, EMPTY, USAGE)]
    assert [o[0] for o in out] == [CHUNK, CHUNK + CHUNK, EMPTY, USAGE]
    assert [o[1] for o in out] == [True, True, False, False]
    assert (relay.text_events, relay.completion_tokens, relay.engine_error) == (3, 17, False)
    assert relay.close() == b""
    relay.feed(ERROR)
    assert relay.engine_error
    tail = relay.fail("cut").decode()
    assert tail.endswith("data: [DONE]\n\n")
    assert json.loads(tail.split("\n\n")[0][6:])["error"]["code"] == 502


COMPLETION_KEYS = (b'"text"', b'"content"')
REASONING = b'data: {"choices":[{"index":0,"delta":{"reasoning":"Let me"}}]}\n\n'
ERROR_EVENT = b'data: {"error": {"message": "x", "code": 500}}\n\n'
SPOKEN = (b'data: {"id":"c","choices":[{"index":0,"text":"data: {\\"error\\"",'
          b'"finish_reason":null}]}\n\n')  # fmt: skip


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    "chunk",
    [CHUNK, CHAT_CHUNK, EMPTY, USAGE, ERROR, ERROR_EVENT, CHUNK + ERROR_EVENT,
     CHAT_CHUNK + ERROR_EVENT, ERROR_EVENT + CHUNK, CHUNK + CHUNK + ERROR_EVENT, SPOKEN,
     SPOKEN + ERROR_EVENT, EMPTY + ERROR_EVENT, b"", b"data: [DONE]\n\n", REASONING,
     REASONING + CHAT_CHUNK],
)  # fmt: skip
def test_a_read_is_counted_as_every_search_of_it_would_count_it(chunk: bytes, chat: bool) -> None:
    """The relay's counts, with as few searches of a read as will do, against the plain ones:
    text by either key, every `data: ` of a read with text, an error event anywhere in it."""
    relay = VllmRelay(chat)
    out, text = relay.feed(chunk)
    # (a completion's text under `text`, or `content`; a chat's under any of its keys)
    assert (out, text) == (chunk, has_text(chunk) if chat else has_text(chunk, COMPLETION_KEYS))
    assert relay.text_events == (chunk.count(b"data: ") if text else 0)
    assert relay.engine_error is (chunk.find(b'data: {"error"') != -1)
    assert relay.carried_usage is (chunk.find(b'"usage"') != -1)


# -- tenants' priorities -----------------------------------------------------------------------

KEYS = {"inter": ("interactive", "sk-i"), "std": ("standard", "sk-s"), "bat": ("batch", "sk-b")}


def tenant_settings(**extra: Any) -> Settings:
    from gateway.pipeline.tenants import hash_key

    tenants = [{"name": n, "key_sha256": hash_key(k), "priority": p}
               for n, (p, k) in KEYS.items()]  # fmt: skip
    return settings(tenants=tenants, **extra)


@pytest.mark.parametrize(
    ("who", "headers", "priorities", "pinned", "priority"),
    [
        ("inter", {}, True, None, -1),
        ("std", {}, True, None, 0),
        ("bat", {}, True, Role.THROUGHPUT, 1),  # batch: the pool or wait
        ("bat", {"x-tiergate-tier": "latency"}, True, Role.LATENCY, 1),  # its own pin wins
        ("bat", {}, False, None, None),  # priorities off: every request equal
    ],
)
async def test_priorities_place_batch_work_on_the_pool(
    who: str, headers: dict[str, str], priorities: bool, pinned: Role | None, priority: int | None
) -> None:
    s = tenant_settings(priorities=priorities)
    auth = {"authorization": f"Bearer {KEYS[who][1]}", **headers}
    ex = await read(s, OKAY, headers=auth)
    assert ex.tenant is not None
    assert ex.tenant.name == who
    assert (ex.pinned, ex.priority) == (pinned, priority)


async def test_batch_work_is_not_pinned_where_no_pool_serves_the_model() -> None:
    s = tenant_settings()
    s = s.model_copy(update={"tiers": s.tiers[:1]})  # the latency tier alone
    ex = await read(s, OKAY, headers={"authorization": "Bearer sk-b"})
    assert ex.pinned is None


@pytest.mark.parametrize(("scheduling", "priority", "sent"), [
    (True, 1, 1), (True, -1, -1), (True, 0, None), (True, None, None), (False, 1, None),
])  # fmt: skip
def test_vllm_priority_goes_to_engines_with_priority_scheduling(
    scheduling: bool, priority: int | None, sent: int | None
) -> None:
    from gateway.config.settings import BackendConfig
    from gateway.wire.vllm.adapter import ADAPTER

    backend = BackendConfig(url=T1, models=["m"], priority_scheduling=scheduling)
    ex = Exchange("id", COMPLETIONS, {}, _no_send, 0.0)
    ex.data, ex.body, ex.priority = dict(OKAY), json.dumps(OKAY).encode(), priority
    for _ in range(2):  # every attempt the same
        path, body = ADAPTER.request(ex, backend)
        assert path == "/v1/completions"
        assert json.loads(body).get("priority") == sent
    assert ex.data == OKAY


# -- a stream's TPOT ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "usage", "events", "tpot"),
    [
        ({}, 11, 11, 0.1),  # 11 tokens over 1 s: 10 intervals
        ({}, None, 11, 0.1),  # no usage: one token an event
        ({}, 21, 11, 0.05),  # speculative steps: usage counts 2 tokens an event
        ({"n": 2}, 22, 22, 0.1),  # two choices decoded side by side: 11 tokens each
        ({"n": 1}, 11, 11, 0.1),
        ({}, 1, 1, None),  # a single token: no interval
        ({"n": 3}, 3, 3, None),
    ],
)  # fmt: skip
def test_a_streams_tpot_is_a_choices_time_per_token(
    data: dict[str, Any], usage: int | None, events: int, tpot: float | None
) -> None:
    ex = Exchange("id", COMPLETIONS, {}, _no_send, 0.0, data=data)
    ex.output_tokens, ex.text_events = usage, events
    ex.first_text_at, ex.last_text_at = 2.0, 3.0
    assert ex.tpot == (None if tpot is None else pytest.approx(tpot))
