"""The engines' Prometheus metrics, with vLLM's (V1) names, labels and default buckets."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
# vLLM's buckets for the tokens an engine step processed.
ITERATION_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
                     8192.0, 16384.0)  # fmt: skip
# vLLM's buckets for token counts (1-2-5 steps up to the model's length).
TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
                 10000.0, 20000.0, 50000.0, 100000.0)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort", "error")
LABELS = ("model_name", "engine")


class EngineMetrics:
    """One registry per engine: tests and several apps in one process never share state."""

    def __init__(
        self,
        model_name: str,
        *,
        block_size: int = 16,
        num_gpu_blocks: int = 0,
        speculative_tokens: int | None = None,
    ) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        lv = {"model_name": model_name, "engine": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=r)

        self.running = gauge(
            "vllm:num_requests_running", "Requests in model execution batches."
        ).labels(**lv)
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Requests waiting to be processed."
        ).labels(**lv)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent."
        ).labels(**lv)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("block_size", "num_gpu_blocks", "engine"),
            registry=r,
        )
        info.labels(str(block_size), str(num_gpu_blocks), "0").set(1)

        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ).labels(**lv)
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        ).labels(**lv)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        ).labels(**lv)
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_BUCKETS,
        ).labels(**lv)
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_BUCKETS,
        ).labels(**lv)
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_BUCKETS,
        ).labels(**lv)
        # The prompt tokens each request's prefill computed (its prefix-cache hits not counted),
        # observed with its prefill time.
        self.prefill_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            TOKEN_BUCKETS,
        ).labels(**lv)
        # One sample per engine step: the tokens it processed, decodes and prompts alike.
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_BUCKETS,
        ).labels(**lv)
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_BUCKETS,
        ).labels(**lv)
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(**lv)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(**lv)
        # Always present, as in vLLM (0 with prefix caching off); in tokens, not requests.
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(**lv)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(**lv)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(**lv)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=r,
        )
        # Every finished_reason series exists from the start, at 0, as in vLLM.
        self.success = {
            reason: success.labels(**lv, finished_reason=reason) for reason in FINISHED_REASONS
        }
        self.spec: tuple[Counter, Counter, Counter, list[Counter]] | None = None
        if speculative_tokens:
            k = speculative_tokens
            per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                (*LABELS, "position"),
                registry=r,
            )
            self.spec = (
                counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(
                    **lv
                ),
                counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(
                    **lv
                ),
                counter(
                    "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
                ).labels(**lv),
                [per_pos.labels(**lv, position=str(i)) for i in range(k)],
            )
