"""Tests of the pure engine-metrics parsers (gateway.wire.metrics and each kind's table)."""

from __future__ import annotations

import math
from collections import defaultdict
from urllib.parse import parse_qs

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.wire.metrics import EngineStats, MetricsParseError
from gateway.wire.triton.metrics import parse_triton_metrics
from gateway.wire.vllm.metrics import METRICS_QUERY, SERIES, parse_vllm_metrics


def _floats(spaced: str) -> list[float]:
    return [float(x) for x in spaced.split()]


# vLLM's default buckets (V1 engine).
TTFT_BUCKETS = _floats("""0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1.0 2.5 5.0 7.5
    10.0 20.0 40.0 80.0 160.0 640.0 2560.0""")
ITL_BUCKETS = _floats(
    "0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1.0 2.5 5.0 7.5 10.0 20.0 40.0 80.0"
)
REQ_BUCKETS = _floats("""0.3 0.5 0.8 1.0 1.5 2.0 2.5 5.0 10 15 20 30 40 50 60 120 240 480 960
    1920 7680""")
TOKEN_BUCKETS = _floats("1 2 5 10 20 50 100 200 500 1000 2000 4096")
ITERATION_BUCKETS = _floats("1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384")

# What the python/process/http collectors add to a real vLLM page: noise the parser must skip.
PROCESS_NOISE = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 18293.0
python_gc_objects_collected_total{generation="1"} 4231.0
python_gc_objects_collected_total{generation="2"} 912.0
# HELP python_info Python platform information
# TYPE python_info gauge
python_info{implementation="CPython",major="3",minor="12",patchlevel="9",version="3.12.9"} 1.0
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 6.1214285824e+010
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76451296317e+09
# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 1234.0
http_requests_total{handler="/metrics",method="GET",status="2xx"} 88.0
# HELP http_request_duration_seconds Latency with only few buckets by handler.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{handler="/v1/completions",le="0.1",method="POST"} 3.0
http_request_duration_seconds_bucket{handler="/v1/completions",le="0.5",method="POST"} 9.0
http_request_duration_seconds_bucket{handler="/v1/completions",le="1.0",method="POST"} 15.0
http_request_duration_seconds_bucket{handler="/v1/completions",le="+Inf",method="POST"} 1234.0
http_request_duration_seconds_count{handler="/v1/completions",method="POST"} 1234.0
http_request_duration_seconds_sum{handler="/v1/completions",method="POST"} 8123.5
"""


def vllm_page(
    engines: dict[tuple[str, str], dict[str, float]],
    *,
    kv_name: str = "vllm:kv_cache_usage_perc",
    spec: bool = True,
) -> str:
    """A /metrics page built the way vLLM builds it: prometheus_client, labels
    (model_name, engine), counters with ``_total`` and ``_created``, default buckets.

    ``engines`` maps (model_name, engine) to the values of that engine.
    """
    reg = CollectorRegistry()
    lbl = ["model_name", "engine"]
    running = Gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        lbl,
        registry=reg,
    )
    waiting = Gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        lbl,
        registry=reg,
    )
    kv = Gauge(kv_name, "KV-cache usage. 1 means 100 percent usage.", lbl, registry=reg)
    cache_info = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        ["block_size", "num_gpu_blocks", "engine"],
        registry=reg,
    )
    preempt = Counter("vllm:num_preemptions", "Cumulative number of preemption.", lbl, registry=reg)
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lbl, registry=reg)
    gen = Counter("vllm:generation_tokens", "Number of generation tokens.", lbl, registry=reg)
    queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", lbl,
                      registry=reg)  # fmt: skip
    hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", lbl, registry=reg)
    success = Counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [*lbl, "finished_reason"],
        registry=reg,
    )
    hists = [
        Histogram(name, "Histogram.", lbl, buckets=buckets, registry=reg)
        for name, buckets in [
            ("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
            ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
            ("vllm:request_time_per_output_token_seconds", ITL_BUCKETS),
            ("vllm:e2e_request_latency_seconds", REQ_BUCKETS),
            ("vllm:request_queue_time_seconds", REQ_BUCKETS),
            ("vllm:request_prefill_time_seconds", REQ_BUCKETS),
            ("vllm:request_decode_time_seconds", REQ_BUCKETS),
            ("vllm:request_prompt_tokens", TOKEN_BUCKETS),
            ("vllm:request_prefill_kv_computed_tokens", TOKEN_BUCKETS),
            ("vllm:request_generation_tokens", TOKEN_BUCKETS),
            ("vllm:iteration_tokens_total", ITERATION_BUCKETS),
        ]
    ]
    if spec:
        drafts = Counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", lbl, registry=reg
        )
        draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lbl, registry=reg
        )
        accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", lbl, registry=reg
        )
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            [*lbl, "position"],
            registry=reg,
        )
    for (model, engine), v in engines.items():
        running.labels(model, engine).set(v.get("running", 0))
        waiting.labels(model, engine).set(v.get("waiting", 0))
        kv.labels(model, engine).set(v.get("kv", 0))
        cache_info.labels("16", "2048", engine).set(1)
        preempt.labels(model, engine).inc(3)
        prompt.labels(model, engine).inc(50_000)
        gen.labels(model, engine).inc(256_000)
        queries.labels(model, engine).inc(50_000)
        hits.labels(model, engine).inc(v.get("hits", 0))
        for reason in ("stop", "length", "abort", "error"):
            success.labels(model, engine, reason).inc(v.get(f"success_{reason}", 0))
        for h in hists:
            for x in (0.004, 0.03, 0.2, 1.7, 9.0):
                h.labels(model, engine).observe(x)
        if spec:
            drafts.labels(model, engine).inc(v.get("drafts", 0))
            draft_tokens.labels(model, engine).inc(v.get("draft_tokens", 0))
            accepted.labels(model, engine).inc(v.get("accepted", 0))
            for pos in range(5):
                per_pos.labels(model, engine, str(pos)).inc(v.get("accepted", 0) / (pos + 2))
    return PROCESS_NOISE + generate_latest(reg).decode()


LLAMA = "meta-llama/Llama-2-7b-chat-hf"
ONE_ENGINE = {
    (LLAMA, "0"): {
        "running": 7,
        "waiting": 2,
        "kv": 0.375,
        "success_stop": 40,
        "success_length": 100,
        "success_abort": 3,
        "drafts": 1000,
        "draft_tokens": 5000,
        "accepted": 2100,
        "hits": 30_000,
    },
}
TWO_ENGINES = {
    (LLAMA, "0"): {
        "running": 7,
        "waiting": 2,
        "kv": 0.375,
        "success_stop": 10,
        "drafts": 10,
        "draft_tokens": 50,
        "accepted": 20,
        "hits": 1_000,
    },
    (LLAMA, "1"): {
        "running": 5,
        "waiting": 0,
        "kv": 0.625,
        "success_length": 4,
        "drafts": 6,
        "draft_tokens": 30,
        "accepted": 9,
    },
}


def reference_parse(text: str) -> dict[str, dict[str, float]]:
    """Independent oracle: prometheus_client's parser and a plain aggregation."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wanted = {
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        "vllm:request_success_total": "success_total",
        "vllm:spec_decode_num_drafts_total": "spec_drafts",
        "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens",
        "vllm:inter_token_latency_seconds_sum": "itl_sum",
        "vllm:inter_token_latency_seconds_count": "itl_count",
        "vllm:prompt_tokens_total": "prompt_tokens",
        "vllm:prefix_cache_hits_total": "prefix_hit_tokens",
        "vllm:request_prefill_time_seconds_sum": "prefill_time_sum",
        "vllm:request_prefill_time_seconds_count": "prefill_time_count",
        "vllm:request_prefill_kv_computed_tokens_sum": "prefill_computed_sum",
        "vllm:iteration_tokens_total_count": "steps",
    }
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            model = s.labels.get("model_name")
            if model is None:
                continue
            if s.name in wanted:
                sums[model][wanted[s.name]] += s.value
            elif s.name == "vllm:kv_cache_usage_perc":
                sums[model]["kv_usage"] = max(sums[model].get("kv_usage", 0.0), s.value)
    return {m: dict(v) for m, v in sums.items()}


def first_20_kb(text: str) -> str:
    """A line-aligned prefix: still valid exposition, the size the parser benchmark quotes."""
    return text[: text.rindex("\n", 0, 20_480) + 1]


def test_realistic_page_is_at_least_20_kb() -> None:
    # Guards the benchmark premise quoted in gateway/wire/metrics.py.
    assert len(vllm_page(ONE_ENGINE).encode()) >= 20_000
    assert 19_000 <= len(first_20_kb(vllm_page(ONE_ENGINE)).encode()) <= 20_480


@pytest.mark.parametrize(
    ("engines", "kv_name", "spec", "expected"),
    [
        pytest.param(
            ONE_ENGINE,
            "vllm:kv_cache_usage_perc",
            True,
            EngineStats(
                running=7,
                waiting=2,
                kv_usage=0.375,
                spec_drafts=1000,
                spec_draft_tokens=5000,
                spec_accepted_tokens=2100,
                success_total=143,
                generation_tokens=256_000,
                itl_sum=pytest.approx(10.934),
                itl_count=5,
                prompt_tokens=50_000,
                prefix_hit_tokens=30_000,
                prefill_time_sum=pytest.approx(10.934),
                prefill_time_count=5,
                prefill_computed_sum=pytest.approx(10.934),
                steps=5,
            ),
            id="one-engine-eagle",
        ),
        pytest.param(
            TWO_ENGINES,
            "vllm:kv_cache_usage_perc",
            True,
            EngineStats(
                running=12,
                waiting=2,
                kv_usage=0.625,
                spec_drafts=16,
                spec_draft_tokens=80,
                spec_accepted_tokens=29,
                success_total=14,
                generation_tokens=512_000,
                itl_sum=pytest.approx(21.868),
                itl_count=10,
                prompt_tokens=100_000,  # summed over the engines
                prefix_hit_tokens=1_000,
                prefill_time_sum=pytest.approx(21.868),
                prefill_time_count=10,
                prefill_computed_sum=pytest.approx(21.868),
                steps=10,
            ),
            id="two-engines-summed-kv-fullest",
        ),
        pytest.param(
            ONE_ENGINE,
            "vllm:gpu_cache_usage_perc",
            False,
            EngineStats(
                running=7, waiting=2, kv_usage=0.375, success_total=143, generation_tokens=256_000,
                itl_sum=pytest.approx(10.934), itl_count=5, prompt_tokens=50_000,
                prefix_hit_tokens=30_000, prefill_time_sum=pytest.approx(10.934),
                prefill_time_count=5, prefill_computed_sum=pytest.approx(10.934), steps=5,
            ),
            id="old-kv-name-no-spec",
        ),
    ],
)
def test_vllm_page(
    engines: dict[tuple[str, str], dict[str, float]],
    kv_name: str,
    spec: bool,
    expected: EngineStats,
) -> None:
    assert parse_vllm_metrics(vllm_page(engines, kv_name=kv_name, spec=spec)) == {LLAMA: expected}


def test_created_samples_and_histograms_do_not_leak_into_counts() -> None:
    text = vllm_page(ONE_ENGINE)
    # the page really has the traps in it ...
    assert "vllm:request_success_created{" in text
    assert "vllm:spec_decode_num_drafts_created{" in text
    assert 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"' in text
    # ... and the counters still read exactly what was counted, not a unix timestamp.
    stats = parse_vllm_metrics(text)[LLAMA]
    assert stats.success_total == 143
    assert stats.spec_drafts == 1000


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(vllm_page(ONE_ENGINE), id="one-engine"),
        pytest.param(vllm_page(TWO_ENGINES), id="two-engines"),
        pytest.param(first_20_kb(vllm_page(TWO_ENGINES)), id="20kb-prefix"),
    ],
)
def test_agrees_with_prometheus_client(text: str) -> None:
    ours = parse_vllm_metrics(text)
    oracle = reference_parse(text)
    assert oracle  # the oracle saw models, so the comparison is not vacuous
    assert set(ours) == set(oracle)
    for model, fields in oracle.items():
        for field, value in fields.items():
            assert getattr(ours[model], field) == pytest.approx(value), (model, field)


# A hand-written page in vLLM's exact layout, two served models (two engines behind one scrape
# target, e.g. a sidecar aggregating), both KV names, timestamps and odd-but-legal syntax.
HANDWRITTEN = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-eagle"} 3.0
vllm:num_requests_running{engine="0",model_name="llama-awq"} 31.0 1764513000123
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-eagle"} 0.0
vllm:num_requests_waiting{ engine = "0" , model_name = "llama-awq" , } 9
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-eagle"} 0.12
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="llama-eagle"} 0.99
vllm:gpu_cache_usage_perc{engine="0",model_name="llama-awq"} 0.5
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama-eagle"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="llama-eagle"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="llama-awq"} 1e+03
# HELP vllm:request_success_created Count of successfully processed requests.
# TYPE vllm:request_success_created gauge
vllm:request_success_created{engine="0",finished_reason="stop",model_name="llama-eagle"} 1.7645e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama-awq"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama-awq"} 1000.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama-awq"} 1000.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama-awq"} 88.25
"""


def test_handwritten_multi_model_page() -> None:
    assert parse_vllm_metrics(HANDWRITTEN) == {
        # the current KV name wins over the old one when an engine sends both
        "llama-eagle": EngineStats(running=3, waiting=0, kv_usage=0.12, success_total=3),
        "llama-awq": EngineStats(running=31, waiting=9, kv_usage=0.5, success_total=1000),
    }


@pytest.mark.parametrize(
    ("model_label", "model"),
    [
        pytest.param(r'"a\"b"', 'a"b', id="escaped-quote"),
        pytest.param(r'"org/m,1}{x=y"', "org/m,1}{x=y", id="comma-and-braces"),
        pytest.param(r'"c:\\models\\m"', r"c:\models\m", id="escaped-backslash"),
        pytest.param(r'"line\nbreak"', "line\nbreak", id="escaped-newline"),
    ],
)
def test_label_values_are_unescaped(model_label: str, model: str) -> None:
    text = f'vllm:num_requests_running{{engine="0",model_name={model_label}}} 4\n'
    assert parse_vllm_metrics(text) == {model: EngineStats(running=4)}


@pytest.mark.parametrize(
    ("value", "check"),
    [
        pytest.param("NaN", math.isnan, id="nan"),
        pytest.param("+Inf", lambda v: v == math.inf, id="plus-inf"),
        pytest.param("-1.5e-3", lambda v: v == -0.0015, id="exponent"),
    ],
)
def test_special_float_values(value: str, check: object) -> None:
    stats = parse_vllm_metrics(f'vllm:num_requests_waiting{{model_name="m",engine="0"}} {value}')
    assert callable(check)
    assert check(stats["m"].waiting)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("# HELP only comments\n# TYPE x gauge\n\n", id="comments-only"),
        pytest.param(PROCESS_NOISE, id="no-vllm-series"),
        pytest.param("vllm:num_requests_running 5\n", id="no-model-label"),
    ],
)
def test_pages_without_models(text: str) -> None:
    assert parse_vllm_metrics(text) == {}


@pytest.mark.parametrize(
    ("text", "lineno"),
    [
        pytest.param("<html>502 Bad Gateway</html>", 1, id="html-error-page"),
        pytest.param(
            '# TYPE g gauge\nvllm:num_requests_running{model_name="m" 1', 2, id="unclosed-labels"
        ),
        pytest.param("ok 1\nvllm:num_requests_running{model_name=m} 1", 2, id="unquoted-value"),
        pytest.param(
            'vllm:num_requests_running{model_name="m" engine="0"} 1', 1, id="missing-comma"
        ),
        pytest.param('vllm:num_requests_running{model_name="m"} one', 1, id="bad-value"),
        pytest.param("python_gc_objects 1 2 3", 1, id="bad-timestamp-in-ignored-series"),
        pytest.param("9lives 1", 1, id="bad-metric-name"),
        pytest.param("just_a_name", 1, id="no-value"),
    ],
)
def test_malformed_input_raises(text: str, lineno: int) -> None:
    with pytest.raises(MetricsParseError, match=rf"^metrics line {lineno}: ") as info:
        parse_vllm_metrics(text)
    assert isinstance(info.value, ValueError)
    assert info.value.lineno == lineno


def test_engine_stats_derived_spec_figures() -> None:
    stats = parse_vllm_metrics(vllm_page(ONE_ENGINE))[LLAMA]
    assert stats.spec_acceptance_rate == pytest.approx(2100 / 5000)
    assert stats.spec_mean_acceptance_length == pytest.approx(1 + 2100 / 1000)
    no_spec = parse_vllm_metrics(vllm_page(ONE_ENGINE, spec=False))[LLAMA]
    assert no_spec.spec_acceptance_rate is None
    assert no_spec.spec_mean_acceptance_length is None
    assert EngineStats(spec_drafts=0, spec_draft_tokens=0, spec_accepted_tokens=0) == EngineStats(
        spec_drafts=0.0, spec_draft_tokens=0.0, spec_accepted_tokens=0.0
    )
    assert EngineStats(spec_drafts=0, spec_accepted_tokens=0).spec_mean_acceptance_length is None


TRITON_PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="llama2_awq",version="1"} 120
nv_inference_request_success{model="llama2_awq",version="2"} 30
nv_inference_request_success{model="llama2_eagle",version="1"} 7
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="llama2_awq",reason="BACKEND",version="1"} 2
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting \
execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="llama2_awq",version="1"} 4
nv_inference_pending_request_count{model="llama2_awq",version="2"} 1
nv_inference_pending_request_count{model="llama2_eagle",version="1"} 0
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="llama2_awq",version="1"} 51234
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-9f0e3c1a-0000-0000-0000-000000000000"} 0.93
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model="llama2_awq",version="1"} 0.41
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model="llama2_awq",version="1"} 9000
vllm:generation_tokens_total{model="llama2_awq",version="2"} 600
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{model="llama2_awq",version="1",le="0.1"} 3
vllm:time_to_first_token_seconds_bucket{model="llama2_awq",version="1",le="+Inf"} 150
vllm:time_to_first_token_seconds_count{model="llama2_awq",version="1"} 150
vllm:time_to_first_token_seconds_sum{model="llama2_awq",version="1"} 12.5
"""


def test_triton_page() -> None:
    assert parse_triton_metrics(TRITON_PAGE) == {
        "llama2_awq": EngineStats(
            running=0, waiting=5, kv_usage=0.41, success_total=150, generation_tokens=9600
        ),
        "llama2_eagle": EngineStats(running=0, waiting=0, kv_usage=None, success_total=7),
    }


def test_triton_parser_ignores_vllm_model_name_series_and_vice_versa() -> None:
    # Each parser keys by its own engine's label; the other's series are not models.
    assert parse_triton_metrics(HANDWRITTEN) == {}
    assert parse_vllm_metrics(TRITON_PAGE) == {}


def test_triton_malformed_raises() -> None:
    with pytest.raises(MetricsParseError, match="line 2"):
        parse_triton_metrics('nv_inference_pending_request_count{model="m"} 1\n{oops} 2\n')


def test_the_query_names_every_series_read_and_nothing_else() -> None:
    """The gateway asks a vLLM page for these samples only (prometheus_client's `name[]`)."""
    assert parse_qs(METRICS_QUERY) == {"name[]": list(SERIES)}
