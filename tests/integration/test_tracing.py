"""OpenTelemetry tracing: the spans of a request, the trace continued from the client and on
to the engines, a failover's two attempts, export over OTLP/HTTP to a receiver process, and
nothing built when the environment does not ask for it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config.settings import load_settings
from gateway.observe.tracing_env import trace_exporters
from gateway.pipeline.tracing import provider_from_env
from gateway.serve.app import COMPLETIONS, Proxy
from gateway.serve.assembly import Gateway, Hosting, open_gateway
from loadtests.harness.procs import wait_http
from tests.conftest import free_port
from tests.integration.stack import MODEL, start_stack

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Engine:
    """A scripted engine on a loopback port: answers `status`, keeps the headers it got."""

    def __init__(self, status: int) -> None:
        self.status, self.port = status, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: list[MutableMapping[str, str]] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(dict(request.headers))
        if self.status != 200:
            return web.json_response({"error": {"message": "busy"}}, status=self.status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("one", " two"):
            chunk = {"choices": [{"index": 0, "text": word}]}
            await resp.write(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", _text)
        app.router.add_get("/metrics", _text)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner


async def _text(_: web.Request) -> web.Response:
    return web.Response(text="")


@pytest.fixture
async def traced() -> AsyncIterator[tuple[Gateway, InMemorySpanExporter, Engine, Engine]]:
    """A gateway whose latency tier refuses (503) and whose throughput tier answers."""
    refusing, answering = Engine(503), Engine(200)
    runners = [await refusing.start(), await answering.start()]
    tiers = [
        {"name": name, "role": role, "backends": [{"url": e.url, "models": [MODEL]}]}
        for name, role, e in (("fast", "latency", refusing), ("bulk", "throughput", answering))
    ]
    settings = load_settings(None, tiers=tiers, policy={"name": "golden-range"},
                             retry={"backoff_initial_s": 0.01, "backoff_max_s": 0.01})  # fmt: skip
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        async with open_gateway(settings, Hosting(tracer_provider=provider)) as gw:
            yield gw, exporter, refusing, answering
    finally:
        for r in runners:
            await r.cleanup()


async def call(gw: Gateway, headers: list[tuple[bytes, bytes]]) -> list[MutableMapping[str, Any]]:
    body = json.dumps({"model": MODEL, "prompt": "hi", "stream": True}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not messages:
            await asyncio.Event().wait()  # the client stays until the answer is sent
        return messages.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": headers, "state": {"gateway": gw}}
    await Proxy(COMPLETIONS)(scope, receive, send)
    return sent


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


async def test_a_failover_traced_from_the_client_to_the_engines(
    traced: tuple[Gateway, InMemorySpanExporter, Engine, Engine],
) -> None:
    gw, exporter, refusing, answering = traced
    sent = await call(gw, [(b"traceparent", TRACEPARENT.encode()), (b"x-request-id", b"r-1")])
    assert sent[0]["status"] == 200
    assert b"two" in b"".join(m.get("body", b"") for m in sent[1:])
    spans = by_name(exporter.get_finished_spans())
    (request,) = spans["POST /v1/completions"]
    assert request.context is not None
    assert request.parent is not None
    # The client's trace, continued: one trace id throughout.
    assert f"{request.context.trace_id:032x}" == TRACE_ID
    assert {f"{s.context.trace_id:032x}" for v in spans.values() for s in v if s.context} == {
        TRACE_ID
    }
    attrs = request.attributes or {}
    assert attrs["tiergate.request.id"] == "r-1"
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["tiergate.stream"] is True
    assert attrs["http.response.status_code"] == 200
    assert (attrs["tiergate.tier"], attrs["tiergate.backend"]) == ("bulk", answering.url)
    assert attrs["tiergate.attempts"] == 2
    (admission,) = spans["admission"]
    (route,) = spans["route"]
    assert route.parent is not None
    assert admission.context is not None
    assert route.parent.span_id == admission.context.span_id
    rattrs = route.attributes or {}
    assert rattrs["tiergate.route.policy"] == "golden-range"
    assert rattrs["tiergate.route.tier"] == "fast"
    assert list(rattrs["tiergate.route.candidates"]) == [refusing.url, answering.url]  # type: ignore[arg-type]
    # The failover: two attempts, in order, each with its outcome.
    first, second = sorted(spans["attempt"], key=lambda s: s.start_time or 0)
    assert (first.attributes or {})["tiergate.backend"] == refusing.url
    assert (first.attributes or {})["tiergate.outcome"] == "http_503"
    assert (first.attributes or {})["http.response.status_code"] == 503
    assert (second.attributes or {})["tiergate.outcome"] == "ok"
    assert (second.attributes or {})["tiergate.backend"] == answering.url
    (stream,) = spans["stream"]
    assert stream.parent is not None
    assert second.context is not None
    assert stream.parent.span_id == second.context.span_id
    assert (stream.attributes or {})["tiergate.text_events"] >= 2  # type: ignore[operator]
    # Each engine got the traceparent of the attempt that called it.
    for engine, attempt in ((refusing, first), (answering, second)):
        (headers,) = engine.seen
        assert attempt.context is not None
        assert headers["traceparent"] == f"00-{TRACE_ID}-{attempt.context.span_id:016x}-01"


async def test_without_traceparent_a_new_trace_starts(
    traced: tuple[Gateway, InMemorySpanExporter, Engine, Engine],
) -> None:
    gw, exporter, _, answering = traced
    await call(gw, [])
    (request,) = by_name(exporter.get_finished_spans())["POST /v1/completions"]
    assert request.parent is None
    assert request.context is not None
    assert f"{request.context.trace_id:032x}" in answering.seen[0]["traceparent"]


def test_off_unless_the_environment_asks() -> None:
    assert trace_exporters({"OTEL_TRACES_EXPORTER": "console, otlp"}) == ["otlp", "console"]
    assert trace_exporters({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318"}) == ["otlp"]
    assert trace_exporters({"OTEL_TRACES_EXPORTER": "jaeger"}) == []
    assert provider_from_env({}) is None
    assert provider_from_env({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) is None
    assert provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                              "OTEL_TRACES_EXPORTER": "none"}) is None  # fmt: skip
    on = provider_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert on is not None
    assert on.resource.attributes["service.name"] == "tiergate"
    on.shutdown()


async def test_off_the_gateway_has_no_tracer_and_requests_carry_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    engine = Engine(200)
    runner = await engine.start()
    tier = {"name": "bulk", "role": "throughput", "backends": [{"url": engine.url,
                                                                "models": [MODEL]}]}  # fmt: skip
    try:
        async with open_gateway(load_settings(None, tiers=[tier])) as gw:
            assert gw.tracing is None
            seen = []
            begin = gw.intake.open

            def open_(*args: Any) -> Any:
                ex = begin(*args)
                seen.append(ex)
                return ex

            monkeypatch.setattr(gw.intake, "open", open_)
            sent = await call(gw, [(b"traceparent", TRACEPARENT.encode())])
            assert sent[0]["status"] == 200
            assert [ex.trace for ex in seen] == [None]
            # The client's own traceparent passes through untouched.
            assert engine.seen[0]["traceparent"] == TRACEPARENT
    finally:
        await runner.cleanup()


def test_off_the_gateway_does_not_load_the_tracing_sdk() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import asyncio, sys\n"
        "from gateway.serve.assembly import open_gateway\n"
        "from gateway.config.settings import load_settings\n"
        "tier = {'name': 't', 'role': 'throughput', 'backends': [{'url': sys.argv[1], "
        "'models': ['m']}]}\n"
        "async def main():\n"
        "    async with open_gateway(load_settings(None, tiers=[tier])) as gw:\n"
        "        assert gw.tracing is None\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gateway.pipeline.tracing', "
        "'opentelemetry.sdk.trace', 'opentelemetry.exporter'))))\n"
    )
    url = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-c", code, url], env=env, capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    # (The API only: redis loads OpenTelemetry's API for its own instrumentation.)
    assert out.stdout.strip() == "[]"


RECEIVER = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest, ExportTraceServiceResponse)

    class Receiver(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()

        def do_POST(self):
            req = ExportTraceServiceRequest()
            req.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            with open(sys.argv[2], "a") as out:
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            out.write(f"{s.trace_id.hex()} {s.name}\\n")
            body = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    HTTPServer(("127.0.0.1", int(sys.argv[1])), Receiver).serve_forever()
""")


def test_spans_exported_over_otlp_to_a_receiver_process(tmp_path: Path) -> None:
    port, spans = free_port(), tmp_path / "spans.txt"
    script = tmp_path / "receiver.py"
    script.write_text(RECEIVER)
    receiver = subprocess.Popen([sys.executable, str(script), str(port), str(spans)])
    stack = None
    try:
        wait_http(f"http://127.0.0.1:{port}/", 10, receiver)
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
               "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "tiergate-test"}  # fmt: skip
        # Round-robin: every other request goes to the failing engine first (the default policy
        # may learn to avoid it, and then no request fails over).
        stack = start_stack(tmp_path, latency=0, throughput=2, env=env,
                            policy={"name": "round-robin"})  # fmt: skip
        # One engine refuses everything with a 503: a request it gets first fails over.
        failing = stack.throughput[0].url
        httpx.post(failing + "/sim/faults", json={"error_rate": 1.0, "error_status": 503},
                   timeout=5).raise_for_status()  # fmt: skip
        for _ in range(4):  # until one went to the failing engine first
            r = httpx.post(stack.gateway.url + "/v1/completions", timeout=10,
                           json={"model": MODEL, "prompt": "hi", "max_tokens": 4})  # fmt: skip
            assert r.status_code == 200
            if r.headers["x-tiergate-attempts"] == "2":
                break
        assert r.headers["x-tiergate-attempts"] == "2"
        deadline = time.monotonic() + 10
        traces: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            lines = spans.read_text().split("\n") if spans.exists() else []
            traces = {}
            for line in filter(None, lines):
                trace_id, name = line.split(" ", 1)
                traces.setdefault(trace_id, []).append(name)
            if any(t.count("attempt") == 2 and "POST /v1/completions" in t
                   for t in traces.values()):  # fmt: skip
                break
            time.sleep(0.05)
        # Every request one trace; the failed-over one with its two attempts.
        for names in traces.values():
            assert {"POST /v1/completions", "admission", "route", "attempt"} <= set(names)
        assert any(names.count("attempt") == 2 for names in traces.values()), traces
    finally:
        if stack is not None:
            stack.stop()
        receiver.terminate()
        receiver.wait(5)
