"""The v5 model repository (engines/triton), Triton backend settings, and the Triton face's pure
parts (request mapping, metrics page)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engines.sim.engine import engine_metrics
from engines.sim.profile import load_profile
from engines.sim.triton import (
    SAMPLING_FIELDS,
    TritonError,
    TritonStats,
    buckets_1_2_5,
    parse_generate,
    render_metrics,
)
from gateway.config.settings import ConfigError, kind_options, load_settings
from gateway.wire.kinds import BUILTIN
from gateway.wire.triton.metrics import parse_triton_metrics
from gateway.wire.triton.options import TritonOptions

REPO = Path(__file__).resolve().parents[2] / "engines" / "triton" / "model_repository"
MODEL = "meta-llama/Llama-2-7b-chat-hf"

# config.pbtxt parameters the vLLM backend reads (src/model.py); any other key does nothing.
BACKEND_PARAMETERS = {"REPORT_CUSTOM_METRICS", "ENABLE_VLLM_HEALTH_CHECK", "GPU_DEVICE_IDS",
                      "EXECUTION_ENV_PATH"}  # fmt: skip
# vLLM AsyncEngineArgs fields model.json may use here (the backend passes the file to them).
ENGINE_ARGS = {"model", "tokenizer", "quantization", "dtype", "max_model_len", "max_num_seqs",
               "gpu_memory_utilization", "disable_log_stats", "tensor_parallel_size",
               "speculative_config", "enforce_eager", "enable_prefix_caching", "seed",
               "served_model_name", "max_num_batched_tokens"}  # fmt: skip


# -- a small protobuf text-format reader (enough for model configs) ---------------------------

_TOKEN = re.compile(r'\s*(?:#[^\n]*\n?|("(?:[^"\\]|\\.)*")|([\[\]{}:,])|([^\s\[\]{}:,"#]+)|$)')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m is not None, f"cannot read config at {text[pos : pos + 20]!r}"
        pos = m.end()
        tok = m.group(1) or m.group(2) or m.group(3)
        if tok:
            out.append(tok)
    return out


def _value(toks: list[str], i: int) -> tuple[Any, int]:
    tok = toks[i]
    if tok == "{":
        return _message(toks, i + 1, "}")
    if tok == "[":
        items: list[Any] = []
        i += 1
        while toks[i] != "]":
            item, i = _value(toks, i)
            items.append(item)
            if toks[i] == ",":
                i += 1
        return items, i + 1
    if tok.startswith('"'):
        return json.loads(tok), i + 1
    if tok in ("true", "True"):
        return True, i + 1
    if tok in ("false", "False"):
        return False, i + 1
    if re.fullmatch(r"-?\d+", tok):
        return int(tok), i + 1
    return tok, i + 1  # an enum value


def _message(toks: list[str], i: int, end: str | None) -> tuple[dict[str, list[Any]], int]:
    fields: dict[str, list[Any]] = {}
    while i < len(toks) and toks[i] != end:
        name = toks[i]
        i += 1
        if toks[i] == ":":
            i += 1
        value, i = _value(toks, i)
        fields.setdefault(name, []).extend(value if isinstance(value, list) else [value])
        if i < len(toks) and toks[i] in (",", ";"):
            i += 1
    return fields, i + 1


def read_pbtxt(path: Path) -> dict[str, list[Any]]:
    fields, _ = _message(_tokens(path.read_text()), 0, None)
    return fields


def test_text_format_reader() -> None:
    text = 'a: "x" # c\nb [ { k: KIND_MODEL count: 2 }, { k: B } ]\nc { d: true }\ne: [1, 2]'
    assert _message(_tokens(text), 0, None)[0] == {
        "a": ["x"], "b": [{"k": ["KIND_MODEL"], "count": [2]}, {"k": ["B"]}],
        "c": [{"d": [True]}], "e": [1, 2],
    }  # fmt: skip


# -- the model repository ---------------------------------------------------------------------

MODELS = sorted(p for p in REPO.iterdir() if p.is_dir())


def test_the_repository_has_the_v5_model() -> None:
    assert [p.name for p in MODELS] == ["llama31-8b-awq"]


@pytest.mark.parametrize("model_dir", MODELS, ids=lambda p: p.name)
def test_config_pbtxt(model_dir: Path) -> None:
    cfg = read_pbtxt(model_dir / "config.pbtxt")
    assert cfg["name"] == [model_dir.name]
    assert cfg["backend"] == ["vllm"]
    assert cfg["max_batch_size"] == [0]
    assert cfg["model_transaction_policy"] == [{"decoupled": [True]}]
    (group,) = cfg["instance_group"]
    assert group == {"count": [1], "kind": ["KIND_MODEL"]}
    params = {p["key"][0]: p["value"][0]["string_value"][0] for p in cfg.get("parameters", [])}
    # Engine arguments belong in model.json: a "model" parameter here is silently ignored.
    assert set(params) <= BACKEND_PARAMETERS, set(params) - BACKEND_PARAMETERS
    assert params["REPORT_CUSTOM_METRICS"] == "true"
    assert "platform" not in cfg


@pytest.mark.parametrize("model_dir", MODELS, ids=lambda p: p.name)
def test_model_json(model_dir: Path) -> None:
    args = json.loads((model_dir / "1" / "model.json").read_text())
    assert set(args) <= ENGINE_ARGS, set(args) - ENGINE_ARGS
    # The tutorial's v3 settings.
    assert args["quantization"] in ("awq", "awq_marlin")
    assert "awq" in args["model"].lower()
    assert (args["max_num_seqs"], args["max_model_len"]) == (384, 4096)
    assert args["gpu_memory_utilization"] == 0.9
    # The backend re-exports vLLM's metrics only with stats logging on.
    assert args["disable_log_stats"] is False


# -- settings ---------------------------------------------------------------------------------


def tiers(**backend: Any) -> list[dict[str, Any]]:
    b = {"url": "http://127.0.0.1:8000", "models": [MODEL], **backend}
    return [{"name": "tp", "role": "throughput", "backends": [b]}]


def test_triton_backend_settings() -> None:
    s = load_settings(None, tiers=tiers(kind="triton", metrics_url="http://127.0.0.1:8002/metrics/",
                                        triton_models={MODEL: "llama31-8b-awq"}))  # fmt: skip
    (b,) = s.tiers[0].backends
    assert b.metrics_url == "http://127.0.0.1:8002/metrics"
    assert b.scrape_url == "http://127.0.0.1:8002/metrics"
    options = kind_options(b, BUILTIN["triton"])
    assert isinstance(options, TritonOptions)
    assert options.triton_models == {MODEL: "llama31-8b-awq"}
    assert options.triton_grpc is None
    grpc = tiers(kind="triton", triton_models={MODEL: "m"}, triton_grpc=" triton:8001 ")
    b = load_settings(None, tiers=grpc).tiers[0].backends[0]
    assert kind_options(b, BUILTIN["triton"]) == TritonOptions(triton_models={MODEL: "m"},
                                                               triton_grpc="triton:8001")
    plain = load_settings(None, tiers=tiers()).tiers[0].backends[0]
    assert plain.scrape_url == "http://127.0.0.1:8000/metrics"


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        ({"kind": "triton"}, "triton_models: Triton model names cannot contain '/'"),
        ({"kind": "triton", "triton_models": {"other": "x"}}, "names models not in models"),
        ({"triton_models": {MODEL: "x"}}, "only applies to backends of kind triton"),
        ({"kind": "triton", "triton_models": {MODEL: "a/b"}}, "cannot contain '/'"),
        ({"triton_grpc": "h:8001"}, "triton_grpc: only applies to backends of kind triton"),
        ({"kind": "triton", "triton_models": {MODEL: "x"}, "triton_grpc": "h"}, "host:port"),
        ({"kind": "triton", "triton_models": {MODEL: "x"}, "triton_grpc": "h:0"}, "between 1"),
        (
            {"kind": "triton", "triton_models": {MODEL: "x"}, "triton_grpc": "grpc://h:1"},
            "host:port",
        ),
        ({"metrics_url": "ftp://h/metrics"}, "metrics_url: must be an http"),
        ({"metrics_url": "http://u:p@h:8002/metrics"}, "metrics_url: must not contain"),
    ],
)
def test_triton_backend_mistakes(backend: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(None, tiers=tiers(**backend))
    assert any(problem in p for p in e.value.problems), e.value.problems


# -- the Triton face: request mapping ---------------------------------------------------------


def test_generate_mapping() -> None:
    g = parse_generate(json.dumps({
        "id": "r1", "text_input": "hi there",
        "parameters": {"stream": True, "exclude_input_in_output": True, "max_tokens": 4,
                       "temperature": 0.5, "return_num_output_tokens": True,
                       "return_finish_reason": False},
    }).encode(), "m")  # fmt: skip
    assert (g.text, g.stream, g.prepend, g.request_id) == ("hi there", True, False, "r1")
    assert g.sampling == {"max_tokens": 4, "temperature": 0.5}
    assert g.outputs == {"num_output_tokens"}
    # Top-level keys map the same way; the prompt is prepended unless excluded (not streaming).
    g = parse_generate(b'{"text_input": "hi", "max_tokens": 2}', "m")
    assert (g.prepend, g.stream, g.sampling) == (True, False, {"max_tokens": 2})
    # sampling_parameters wins over request parameters, and may hold lists.
    raw = {"text_input": "x", "sampling_parameters": '{"stop": ["a", "b"]}', "parameters":
           {"max_tokens": 3}}  # fmt: skip
    assert parse_generate(json.dumps(raw).encode(), "m").sampling == {"stop": ["a", "b"]}
    assert {"max_tokens", "temperature", "stop", "ignore_eos", "seed"} <= SAMPLING_FIELDS


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{nope", "failed to parse the request JSON buffer"),
        (b"[1]", "failed to parse the request JSON buffer"),
        (b'{"parameters": {"max_tokens": 3}}', "missing required input(s) ['text_input']"),
        (b'{"text_input": "x", "parameters": {"stop": ["a"]}}', "parameter 'stop' has invalid"),
        (b'{"text_input": "x", "parameters": []}', "Expected JSON object"),
        (b'{"text_input": "x", "stream": "yes"}', "non-boolean"),
        (b'{"text_input": 3}', "Unable to parse JSON bytes"),
        (b'{"text_input": "x", "id": 3}', "Unable to parse 'id'"),
    ],
)
def test_generate_mapping_errors_are_400(body: bytes, message: str) -> None:
    with pytest.raises(TritonError) as e:
        parse_generate(body, "m")
    assert e.value.status == 400
    assert message in e.value.message


# -- the Triton face: metrics -----------------------------------------------------------------


def test_metrics_page_names_and_what_the_gateway_reads() -> None:
    profile = load_profile("v3")
    engine = engine_metrics(profile, "llama31-8b-awq")
    engine.generation_tokens.inc(7)
    engine.ttft.observe(0.03)
    stats = TritonStats(profile.max_model_len)
    stats.pending, stats.success, stats.failure["BACKEND"] = 3, 5, 1
    page = render_metrics("llama31-8b-awq", stats, engine)
    lab = 'model="llama31-8b-awq",version="1"'
    for line in (
        f"nv_inference_pending_request_count{{{lab}}} 3",
        f"nv_inference_request_success{{{lab}}} 5",
        'nv_inference_request_failure{model="llama31-8b-awq",reason="BACKEND",version="1"} 1',
        f"vllm:generation_tokens_total{{{lab}}} 7",
        f'vllm:time_to_first_token_seconds_bucket{{{lab},le="0.02"}} 0',
        f'vllm:time_to_first_token_seconds_bucket{{{lab},le="0.04"}} 1',
        f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} 1',
        f"nv_inference_queue_duration_us{{{lab}}} 0",
        "# TYPE nv_inference_request_success counter",
        "# TYPE vllm:e2e_request_latency_seconds histogram",
    ):
        assert line in page.splitlines(), line
    # No running/waiting/KV gauges (the V1 backend exports none), no _total on Triton's own.
    assert "vllm:num_requests" not in page
    assert "cache_usage" not in page
    assert "nv_inference_request_success_total" not in page
    (stats_,) = parse_triton_metrics(page).values()
    assert (stats_.running, stats_.waiting, stats_.success_total) == (0, 3, 5)


def test_buckets_1_2_5() -> None:
    assert buckets_1_2_5(60) == (1, 2, 5, 10, 20, 50)
    assert buckets_1_2_5(4096)[-1] == 2000
