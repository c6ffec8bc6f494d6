"""The simulator's Triton face: Triton Inference Server with the vLLM backend, on the wire.

The simulated engine of the vLLM face (engines.sim.server.Simulator) behind Triton's HTTP API,
so that a v3 profile can stand in for the tutorial's v5 step (engines/triton/):
- health: GET /v2/health/live and /v2/health/ready: 200, or 400 when not ready, empty body;
  metadata: /v2, /v2/models/{m}[/versions/1], .../config, .../ready;
- POST /v2/models/{m}[/versions/1]/generate and /generate_stream (the generate extension), with
  Triton's request mapping (a key naming a model input becomes a tensor, any other key a request
  parameter, which must be a scalar) and the vLLM backend's semantics: sampling parameters from
  the `sampling_parameters` input or else the request parameters, the prompt prepended unless
  `exclude_input_in_output`, SSE `data:` events without `[DONE]`, optional outputs
  `finish_reason` ("None" until the end), `num_input_tokens`, `num_output_tokens` (per event);
- errors `{"error": "..."}`: 400 for what Triton itself rejects, 500 "Error generating stream:
  ..." for what fails in the backend (vLLM's own checks included: an over-long prompt is a 500
  here, not vLLM's 400). The status is set by the first response: an error after it is an event
  of a 200 stream, and a failed first response of a stream is SSE-framed;
- metrics in Triton's names (nv_inference_*, labels model and version) and the vllm: series the
  backend re-exports (REPORT_CUSTOM_METRICS), labels model and version, with the backend's
  buckets; like the current backend (vLLM V1), no running/waiting/KV gauges. On the main port
  at /metrics, or on a port of their own as Triton does on 8002.
A request is pending (nv_inference_pending_request_count) from its arrival until the engine
takes it; fault delays (slow, hang) happen before that, so they show up as pending requests.
The gRPC face (Triton's 8001: readiness, metadata, the decoupled ModelStreamInfer) is
engines.sim.triton_grpc, served with `--grpc-port` by the same process and engine.
Not modelled: /infer, model control, binary tensors, logprob values.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from engines.front.metrics import EngineMetrics
from engines.front.schemas import CompletionRequest
from engines.front.wire import ApiError, collect, warm_up
from engines.sim import tokens
from engines.sim.server import HasHeaders, Job, SimConfig, Simulator, merge_faults

log = logging.getLogger(__name__)

VERSION = "1"  # the one model version served
SERVER_VERSION = "2.0.0+tiergate.sim"
SSE = "text/event-stream; charset=utf-8"
# The vLLM backend's inputs (auto-completed into the model config): name, datatype, dims.
INPUTS: Mapping[str, tuple[str, tuple[int, ...]]] = MappingProxyType({
    "text_input": ("BYTES", (1,)),
    "image": ("BYTES", (-1,)),
    "stream": ("BOOL", (1,)),
    "sampling_parameters": ("BYTES", (1,)),
    "exclude_input_in_output": ("BOOL", (1,)),
    "return_finish_reason": ("BOOL", (1,)),
    "return_cumulative_logprob": ("BOOL", (1,)),
    "return_logprobs": ("BOOL", (1,)),
    "return_num_input_tokens": ("BOOL", (1,)),
    "return_num_output_tokens": ("BOOL", (1,)),
})  # fmt: skip
OUTPUTS: Mapping[str, tuple[str, tuple[int, ...]]] = MappingProxyType({
    "text_output": ("BYTES", (-1,)),
    "finish_reason": ("BYTES", (-1,)),
    "cumulative_logprob": ("FP32", (-1,)),
    "logprobs": ("BYTES", (-1,)),
    "num_input_tokens": ("UINT32", (1,)),
    "num_output_tokens": ("UINT32", (-1,)),
})  # fmt: skip
# vLLM SamplingParams fields: any other key makes the backend's SamplingParams(**...) fail.
SAMPLING_FIELDS = frozenset({
    "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
    "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "bad_words", "ignore_eos",
    "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "detokenize",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "truncate_prompt_tokens", "allowed_token_ids", "extra_args", "logit_bias",
    "structured_outputs", "guided_decoding", "output_kind", "lora_name",
})  # fmt: skip
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# The vllm: series the backend re-exports: (name, source in EngineMetrics, buckets); the
# backend's buckets are all bucket bounds of the engine's, so the counts carry over exactly.
REEXPORTED_HISTOGRAMS: tuple[tuple[str, str, str, tuple[float, ...]], ...] = (
    ("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds",
     "Histogram of time to first token in seconds.",
     (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)),
    ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
     "Histogram of time per output token in seconds.",
     (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)),
    ("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds",
     "Histogram of end to end request latency in seconds.",
     (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)),
)  # fmt: skip
REEXPORTED_COUNTERS = (
    ("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
    ("vllm:generation_tokens_total", "Number of generation tokens processed."),
)


class TritonError(Exception):
    """An answer `{"error": message}` with an HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _dumps(obj: Any) -> str:
    # Triton writes compact JSON, outputs in name order (a std::map).
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_dumps(obj), status_code=status, media_type="application/json")


def _error(status: int, message: str, *, sse: bool = False) -> Response:
    body = _dumps({"error": message})
    if sse:
        return Response(f"data: {body}\n\n", status_code=status, media_type=SSE)
    return _json({"error": message}, status)


def _event(obj: Mapping[str, Any]) -> bytes:
    return f"data: {_dumps(obj)}\n\n".encode()


def buckets_1_2_5(limit: int) -> tuple[float, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `limit`."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass
class _Hist:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class TritonStats:
    """Triton's per-model statistics (the nv_inference_* families) for the one model served."""

    max_model_len: int
    pending: int = 0
    success: int = 0
    failure: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    inferences: int = 0
    executions: int = 0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_infer_us: float = 0.0
    prompt_tokens: _Hist = field(init=False)
    generation_tokens: _Hist = field(init=False)
    params_n: _Hist = field(default_factory=lambda: _Hist((1.0, 2.0, 5.0, 10.0, 20.0)))

    def __post_init__(self) -> None:
        self.prompt_tokens = _Hist(buckets_1_2_5(self.max_model_len))
        self.generation_tokens = _Hist(buckets_1_2_5(self.max_model_len))


class _Books:
    """One request in Triton's books: pending from arrival until the engine takes it."""

    def __init__(self, stats: TritonStats, prompt_tokens: int) -> None:
        self.stats, self.prompt = stats, prompt_tokens
        self.arrived = time.monotonic()
        self.started: float | None = None
        self.closed = False
        stats.pending += 1

    def start(self) -> None:
        if self.started is None:
            self.started = time.monotonic()
            self.stats.pending -= 1
            self.stats.queue_us += (self.started - self.arrived) * 1e6

    def end(self, outcome: str, generated: int = 0) -> None:
        """`outcome` is "success" or a failure reason."""
        if self.closed:
            return
        self.start()
        self.closed = True
        assert self.started is not None
        now, s = time.monotonic(), self.stats
        s.request_us += (now - self.arrived) * 1e6
        s.compute_infer_us += (now - self.started) * 1e6
        if outcome != "success":
            s.failure[outcome] += 1
            return
        s.success += 1
        s.inferences += 1
        s.executions += 1
        s.prompt_tokens.observe(self.prompt)
        s.generation_tokens.observe(generated)
        s.params_n.observe(1)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render_metrics(model: str, stats: TritonStats, engine: EngineMetrics) -> str:
    """The metrics page, as Triton writes it (prometheus-cpp: counters keep their own names)."""
    labels = f'model="{model}",version="{VERSION}"'
    lines: list[str] = []

    def family(name: str, kind: str, doc: str, samples: Iterable[tuple[str, str, float]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{n}{{{lab}}} {_num(v)}" for n, lab, v in samples)

    def plain(name: str, kind: str, doc: str, value: float) -> None:
        family(name, kind, doc, [(name, labels, value)])

    for name, kind, doc, value in (
        ("nv_inference_request_success", "counter",
         "Number of successful inference requests, all batch sizes", stats.success),
        ("nv_inference_count", "counter",
         "Number of inferences performed (does not include cached requests)", stats.inferences),
        ("nv_inference_exec_count", "counter",
         "Number of model executions performed (does not include cached requests)",
         stats.executions),
        ("nv_inference_pending_request_count", "gauge",
         "Instantaneous number of pending requests awaiting execution per-model.", stats.pending),
        ("nv_inference_request_duration_us", "counter",
         "Cumulative inference request duration in microseconds (includes cached requests)",
         round(stats.request_us)),
        ("nv_inference_queue_duration_us", "counter",
         "Cumulative inference queuing duration in microseconds (includes cached requests)",
         round(stats.queue_us)),
        ("nv_inference_compute_input_duration_us", "counter",
         "Cumulative compute input duration in microseconds (does not include cached requests)",
         0),
        ("nv_inference_compute_infer_duration_us", "counter",
         "Cumulative compute inference duration in microseconds (does not include cached "
         "requests)", round(stats.compute_infer_us)),
        ("nv_inference_compute_output_duration_us", "counter",
         "Cumulative inference compute output duration in microseconds (does not include cached "
         "requests)", 0),
    ):  # fmt: skip
        plain(name, kind, doc, value)
    failures = [(f'model="{model}",reason="{r}",version="{VERSION}"', n)
                for r, n in stats.failure.items()]  # fmt: skip
    family("nv_inference_request_failure", "counter",
           "Number of failed inference requests, all batch sizes",
           [("nv_inference_request_failure", lab, n) for lab, n in failures])  # fmt: skip

    values: dict[tuple[str, str | None], float] = {}
    for fam in engine.registry.collect():
        for s in fam.samples:
            values[(s.name, s.labels.get("le"))] = s.value
    for name, doc in REEXPORTED_COUNTERS:
        plain(name, "counter", doc, values.get((name, None), 0.0))
    for name, source, doc, bounds in REEXPORTED_HISTOGRAMS:
        les = {float(le): v for (n, le), v in values.items() if n == source + "_bucket" and le}
        family(name, "histogram", doc, _histogram(name, labels, bounds, les,
               values.get((source + "_count", None), 0.0),
               values.get((source + "_sum", None), 0.0)))  # fmt: skip
    for name, doc, h in (
        ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
        ("vllm:request_generation_tokens", "Number of generation tokens processed.",
         stats.generation_tokens),
        ("vllm:request_params_n", "Histogram of the n request parameter.", stats.params_n),
    ):  # fmt: skip
        cumulative = dict(zip(h.buckets, h.counts, strict=True))
        samples = _histogram(name, labels, h.buckets, cumulative, h.n, h.total)
        family(name, "histogram", doc, samples)
    return "\n".join(lines) + "\n"


def _histogram(
    name: str,
    labels: str,
    bounds: tuple[float, ...],
    cumulative: Mapping[float, float],
    count: float,
    total: float,
) -> list[tuple[str, str, float]]:
    out = [(f"{name}_count", labels, count), (f"{name}_sum", labels, total)]
    for bound in bounds:
        below = [v for le, v in cumulative.items() if le <= bound]
        value = cumulative.get(bound, max(below, default=0.0))
        out.append((f"{name}_bucket", f'{labels},le="{bound:g}"', value))
    out.append((f"{name}_bucket", f'{labels},le="+Inf"', count))
    return out


@dataclass(frozen=True, slots=True)
class Generate:
    """A generate request after Triton's mapping and the vLLM backend's reading of it."""

    text: str
    stream: bool
    prepend: bool
    sampling: dict[str, Any]
    outputs: frozenset[str]  # the optional outputs asked for (return_<name>)
    request_id: str | None


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, bool):
        raise TritonError(400, f"Unable to parse 'data': attempt to access JSON non-boolean as "
                          f"boolean (input '{name}')")  # fmt: skip
    return value


def _as_str(name: str, value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise TritonError(400, f"Unable to parse JSON bytes array (input '{name}')")
    return value


def parse_generate(body: bytes, model: str) -> Generate:
    """Triton's part: JSON to tensors and request parameters (400 on any problem there); the
    backend's part (sampling parameters, prompt handling) raises ApiError, which the caller turns
    into the backend's 500."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TritonError(400, f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(obj, dict):
        raise TritonError(400, "failed to parse the request JSON buffer: not a JSON object")
    tensors: dict[str, Any] = {}
    params: dict[str, Any] = {}

    def place(key: str, value: Any) -> None:
        if key in INPUTS:
            tensors[key] = value
        elif isinstance(value, bool | int | float | str):
            params[key] = value
        else:
            raise TritonError(400, f"parameter '{key}' has invalid type. It should be either "
                              "'int', 'bool', or 'string'.")  # fmt: skip

    request_id = None
    for key, value in obj.items():
        if key == "id":
            if not isinstance(value, str):
                raise TritonError(400, "Unable to parse 'id'")
            request_id = value
        elif key == "parameters":
            if not isinstance(value, dict):
                raise TritonError(400, "Expected JSON object for keyword: 'parameters'")
            for k, v in value.items():
                place(k, v)
        else:
            place(key, value)
    return generate_of(tensors, params, request_id, model)


def generate_of(
    tensors: Mapping[str, Any], params: dict[str, Any], request_id: str | None, model: str
) -> Generate:
    """The vLLM backend's reading of a request's tensors and parameters (either API's)."""
    if "text_input" not in tensors:
        got = sorted(tensors)
        raise TritonError(
            400,
            f"[request id: {request_id or '<id_unknown>'}] expected number of inputs between 1 "
            f"and {len(INPUTS)} but got {len(got)} inputs for model '{model}'. Got input(s) "
            f"{got}, but missing required input(s) ['text_input']. Please provide all required "
            "input(s).",
        )
    text = _as_str("text_input", tensors["text_input"])
    stream = _as_bool("stream", tensors.get("stream", False))
    exclude = tensors.get("exclude_input_in_output")
    # Without the input the backend prepends the prompt, except when streaming.
    prepend = not (_as_bool("exclude_input_in_output", exclude) if exclude is not None else stream)
    outputs = frozenset(
        k.removeprefix("return_") for k in INPUTS
        if k.startswith("return_") and k in tensors and _as_bool(k, tensors[k])
    )  # fmt: skip
    sampling: dict[str, Any] = params
    if "sampling_parameters" in tensors:
        raw = _as_str("sampling_parameters", tensors["sampling_parameters"])
        try:
            sampling = json.loads(raw)
        except json.JSONDecodeError as e:
            sampling = {"<unparsable>": str(e)}  # the backend fails on it (TritonFront.job)
        if not isinstance(sampling, dict):
            sampling = {"<not an object>": sampling}
    return Generate(text, stream, prepend, sampling, outputs, request_id)


@dataclass
class TritonFront:
    """Everything the Triton face keeps: the simulator, its model name, Triton's statistics."""

    cfg: SimConfig
    sim: Simulator
    model: str
    stats: TritonStats

    def job(self, request: HasHeaders, gen: Generate) -> tuple[Job, int]:
        """The backend's reading of the request: a Job, or ApiError (the backend's failure)."""
        if gen.prepend and gen.stream:
            raise ApiError(500, "When streaming, `exclude_input_in_output` = False is not allowed.")
        sampling = {k: v for k, v in gen.sampling.items() if v is not None}
        unknown = sorted(set(sampling) - SAMPLING_FIELDS)
        if unknown:
            raise ApiError(500, f"invalid sampling parameters: unexpected keyword(s) {unknown}")
        n_prompt = tokens.count_text(gen.text)
        limit = self.cfg.profile.max_model_len
        if n_prompt >= limit:
            raise ApiError(500, f"The decoder prompt (length {n_prompt}) is longer than the "
                           f"maximum model length of {limit}.")  # fmt: skip
        try:
            body = CompletionRequest.model_validate({**sampling, "prompt": gen.text, "model": None})
        except ValidationError as e:
            err = e.errors()[0]
            raise ApiError(500, f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        # vLLM's engine stops a sequence at the context length rather than refusing it.
        max_tokens = min(body.max_tokens or 16, limit - n_prompt)
        job = self.sim.admit(request, body, n_prompt, max_tokens, "triton")
        job.block_hashes = self.sim.prefix_hashes(job, tokens.prompt_tokens(gen.text))
        return job, n_prompt

    def response(
        self, gen: Generate, job: Job, text: str, finish: str | None, n_out: int
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"model_name": self.model, "model_version": VERSION,
                               "text_output": text}  # fmt: skip
        if gen.request_id:
            out["id"] = gen.request_id
        if "finish_reason" in gen.outputs:
            out["finish_reason"] = str(finish)  # the backend's str(None) included
        if "num_input_tokens" in gen.outputs:
            out["num_input_tokens"] = job.prompt_tokens
        if "num_output_tokens" in gen.outputs:
            out["num_output_tokens"] = n_out
        if "cumulative_logprob" in gen.outputs:
            out["cumulative_logprob"] = 0.0
        if "logprobs" in gen.outputs:
            out["logprobs"] = "null"
        return out


# Starts a front's gRPC face and returns its server, which the app stops on shutdown
# (engines.sim.triton_grpc.serve_grpc bound to an address, by the command that composes the
# two: grpc and tritonclient load only where a simulator serves gRPC).
GrpcFace = Callable[["TritonFront"], Awaitable[Any]]


def create_apps(
    cfg: SimConfig, *, separate_metrics: bool = False, grpc: GrpcFace | None = None
) -> tuple[Starlette, Starlette]:
    """The Triton API app and the metrics app. With `separate_metrics` the metrics are only on
    the second app (serve it on its own port, as Triton's 8002); otherwise also at /metrics.
    With `grpc` the app's lifespan also serves the gRPC face."""
    model = cfg.served_models[0]
    if "/" in model or len(cfg.served_models) != 1:
        raise ValueError(f"a Triton model name is one name without '/', got {cfg.served_models}")
    sim = Simulator(cfg)
    front = TritonFront(cfg, sim, model, TritonStats(cfg.profile.max_model_len))

    def model_route(
        fn: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            name = request.path_params["model"]
            version = request.path_params.get("version")
            if name != model or version not in (None, VERSION):
                which = f"'{name}'" if version is None else f"'{name}' version {version}"
                return _error(400, f"Request for unknown model: {which} is not found")
            try:
                return await fn(request)
            except TritonError as e:
                return _error(e.status, e.message)

        return wrapped

    async def generate(request: Request) -> Response:
        streaming = request.url.path.endswith("_stream")
        gen = parse_generate(await request.body(), model)
        try:
            job, n_prompt = front.job(request, gen)
        except ApiError as e:
            front.stats.failure["BACKEND"] += 1
            return _error(500, f"Error generating stream: {e.message}", sse=streaming)
        books = _Books(front.stats, n_prompt)
        prefix = gen.text if gen.prepend else ""
        if streaming and gen.stream:
            return await _stream(front, gen, job, books)
        try:
            pieces = await collect(sim.pieces(job, on_start=books.start), request)
        except ApiError as e:
            books.end("BACKEND")
            return _error(500, f"Error generating stream: {e.message}", sse=streaming)
        except asyncio.CancelledError:
            books.end("CANCELED")
            raise
        books.end("success", job.plan.tokens)
        if gen.stream and len(pieces) > 1:
            # Decoupled responses on /generate: Triton has already sent 200 when it notices.
            return _json({"error": "generate expects model to produce exactly 1 response, use "
                          "generate stream for model that generates various number of "
                          "responses"})  # fmt: skip
        reply = front.response(gen, job, prefix + "".join(p for p, _ in pieces),
                               job.plan.finish_reason, job.plan.tokens)  # fmt: skip
        if streaming:
            return Response(_event(reply), media_type=SSE)
        return _json(reply)

    async def server_health(request: Request) -> Response:
        kind = request.path_params["kind"]
        if kind not in ("live", "ready"):
            return _error(404, "Not Found")
        ready = kind == "live" or not cfg.faults.unhealthy
        return Response(status_code=200 if ready else 400)

    async def model_ready(request: Request) -> Response:
        return Response(status_code=400 if cfg.faults.unhealthy else 200)

    async def server_metadata(request: Request) -> Response:
        return _json({"name": "triton", "version": SERVER_VERSION,
                      "extensions": ["classification", "sequence", "model_repository",
                                     "schedule_policy", "model_configuration", "parameters",
                                     "statistics", "trace", "logging", "generate"]})  # fmt: skip

    async def model_metadata(request: Request) -> Response:
        def tensors(spec: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[dict[str, Any]]:
            return [{"name": n, "datatype": d, "shape": s} for n, (d, s) in spec.items()]

        return _json({"name": model, "versions": [VERSION], "platform": "vllm",
                      "inputs": tensors(INPUTS), "outputs": tensors(OUTPUTS)})  # fmt: skip

    async def model_config(request: Request) -> Response:
        return _json({
            "name": model, "backend": "vllm", "max_batch_size": 0,
            "model_transaction_policy": {"decoupled": True},
            "instance_group": [{"name": f"{model}_0", "kind": "KIND_MODEL", "count": 1}],
            "parameters": {"REPORT_CUSTOM_METRICS": {"string_value": "true"}},
            "input": [{"name": n, "data_type": f"TYPE_{'STRING' if d == 'BYTES' else d}",
                       "dims": s, "optional": n != "text_input"} for n, (d, s) in INPUTS.items()],
            "output": [{"name": n, "data_type": f"TYPE_{'STRING' if d == 'BYTES' else d}",
                        "dims": s} for n, (d, s) in OUTPUTS.items()],
        })  # fmt: skip

    async def metrics(request: Request) -> Response:
        page = render_metrics(model, front.stats, sim.metrics)
        return Response(page, media_type="text/plain; charset=utf-8")

    async def faults(request: Request) -> Response:
        """Inspect or change the fault settings (chaos tests); not part of Triton's API."""
        if request.method == "POST":
            try:
                cfg.faults = merge_faults(cfg.faults, json.loads(await request.body()))
            except json.JSONDecodeError as e:
                return _error(400, f"Invalid JSON body: {e}")
            except ApiError as e:
                return _error(400, e.message)
            if cfg.faults.hang:
                sim.engine.freeze()
        return _json(cfg.faults.model_dump())

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        return _error(status, "Method Not Allowed" if status == 405 else "Not Found")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await warm_up()
        async with sim.running():
            if grpc is None:
                yield
                return
            server = await grpc(front)
            try:
                yield
            finally:
                await server.stop(0.5)

    base = "/v2/models/{model}"
    routes = [
        Route("/v2/health/{kind:str}", server_health),
        Route("/v2", server_metadata),
        Route("/sim/faults", faults, methods=["GET", "POST"]),
    ]
    for prefix in (base, base + "/versions/{version}"):
        routes += [
            Route(prefix, model_route(model_metadata)),
            Route(prefix + "/ready", model_route(model_ready)),
            Route(prefix + "/config", model_route(model_config)),
            Route(prefix + "/generate", model_route(generate), methods=["POST"]),
            Route(prefix + "/generate_stream", model_route(generate), methods=["POST"]),
        ]
    handlers = {404: not_found, 405: not_found}
    metrics_route = Route("/metrics", metrics)
    app = Starlette(
        routes=routes if separate_metrics else [*routes, metrics_route],
        lifespan=lifespan,
        exception_handlers=handlers,
    )
    app.state.sim, app.state.front = sim, front
    return app, Starlette(routes=[metrics_route], exception_handlers=handlers)


async def _stream(front: TritonFront, gen: Generate, job: Job, books: _Books) -> Response:
    """generate_stream with `stream: true`: one event per engine step. The first step decides
    the status, as in Triton; a later failure is an error event, then the stream ends."""
    pieces = front.sim.pieces(job, on_start=books.start)
    try:
        first = await anext(pieces)
    except ApiError as e:
        books.end("BACKEND")
        return _error(500, f"Error generating stream: {e.message}", sse=True)
    except asyncio.CancelledError:
        books.end("CANCELED")
        await pieces.aclose()
        raise

    def event(text: str, last: bool, sent: int) -> tuple[bytes, int]:
        # One token per word: a step's tokens are its words, the last step takes the rest
        # (a stop string may have cut its text).
        n = job.plan.tokens - sent if last else text.count(" ")
        finish = job.plan.finish_reason if last else None
        return _event(front.response(gen, job, text, finish, n)), sent + n

    async def events() -> AsyncIterator[bytes]:
        outcome, sent = "CANCELED", 0
        try:
            data, sent = event(*first, sent)
            yield data
            async for text, last in pieces:
                data, sent = event(text, last, sent)
                yield data
            outcome = "success"
        except ApiError as e:
            outcome = "BACKEND"
            yield _event({"error": f"Error generating stream: {e.message}"})
        finally:
            books.end(outcome, sent)
            await pieces.aclose()

    return StreamingResponse(events(), media_type=SSE)


class _Sidecar(uvicorn.Server):
    """A second server in the same process and loop (the metrics port): the main server owns
    the signals and stops this one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def run(
    cfg: SimConfig,
    *,
    host: str,
    port: int,
    metrics_port: int | None,
    log_level: str,
    grpc: GrpcFace | None = None,
) -> None:
    """Serve the Triton face (its metrics on `metrics_port`, if given, and its gRPC face by
    `grpc`) until stopped."""
    import uvloop

    app, metrics_app = create_apps(cfg, separate_metrics=metrics_port is not None, grpc=grpc)
    common: dict[str, Any] = {"host": host, "log_level": log_level, "access_log": False,
                              "loop": "uvloop", "http": "httptools",
                              "timeout_graceful_shutdown": 1}  # fmt: skip
    main = uvicorn.Server(uvicorn.Config(app, port=port, **common))

    async def serve() -> None:
        if metrics_port is None:
            await main.serve()
            return
        side = _Sidecar(uvicorn.Config(metrics_app, port=metrics_port, lifespan="off", **common))
        task = asyncio.create_task(side.serve())
        try:
            await main.serve()
        finally:
            side.should_exit = True
            await task

    uvloop.run(serve())
