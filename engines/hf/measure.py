"""The tutorial's v0/v1 on a real GPU: Hugging Face `generate` on a Llama-2-7B-shaped model.

The tutorial's first two rows are plain transformers `generate` (v0: the default attention, v1: a
fused attention kernel), one request at a time. This measures them on whatever GPU it runs on,
with the tables' workload: a 50-token prompt, 256 output tokens, greedy, batch 1.

The weights are random (no checkpoint download is needed): with the output length forced to 256
tokens (`min_new_tokens`), the work per token, and so every timing, is the same as with the real
checkpoint; the text is meaningless. Timestamps come from a streamer that `generate` calls with
each new token (after it is on the host), so TTFT is prefill + first token and TPOT the mean gap
between later tokens, as benchmark-method.md defines them.

    python -m engines.hf.measure --out results.json [--runs 5] [--config eager --config sdpa]

Needs torch with a CUDA GPU and transformers (the `hf` extra); prints one JSON line per
configuration and writes them all to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Llama-2-7B's architecture (meta-llama/Llama-2-7b-chat-hf config.json).
LLAMA2_7B: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
PROMPT_TOKENS = 50
OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class Timing:
    """One request: seconds from the call to the first token, mean gap after it, to the end."""

    ttft_s: float
    tpot_s: float
    e2e_s: float
    tokens: int

    @property
    def tok_s(self) -> float:
        return self.tokens / self.e2e_s


def timing(start: float, token_times: Sequence[float]) -> Timing:
    """From the call's start and each output token's arrival (monotonic seconds)."""
    if not token_times:
        raise ValueError("no tokens")
    first, last = token_times[0], token_times[-1]
    n = len(token_times)
    tpot = (last - first) / (n - 1) if n > 1 else 0.0
    return Timing(ttft_s=first - start, tpot_s=tpot, e2e_s=last - start, tokens=n)


@dataclass(frozen=True)
class Result:
    config: str
    attn_implementation: str
    use_cache: bool
    runs: int
    ttft_ms: float  # medians over runs
    tpot_ms: float
    e2e_s: float
    tok_s: float
    peak_mem_gb: float
    # GPU kernel time per generated token (profiler, one 32-token request): far below TPOT
    # means the per-token time goes to the host (Python, kernel launches), not to the GPU.
    gpu_busy_ms_per_token: float
    gpu: str
    torch: str
    transformers: str


def summarize(config: str, attn: str, use_cache: bool, runs: Sequence[Timing],
              peak_bytes: int, gpu_busy_ms: float, versions: dict[str, str]) -> Result:  # fmt: skip
    return Result(
        config=config,
        attn_implementation=attn,
        use_cache=use_cache,
        runs=len(runs),
        ttft_ms=1000 * statistics.median(r.ttft_s for r in runs),
        tpot_ms=1000 * statistics.median(r.tpot_s for r in runs),
        e2e_s=statistics.median(r.e2e_s for r in runs),
        tok_s=statistics.median(r.tok_s for r in runs),
        peak_mem_gb=peak_bytes / 1e9,
        gpu_busy_ms_per_token=gpu_busy_ms,
        **versions,
    )


def measure(attn: str, use_cache: bool, runs: int, seed: int = 0) -> Result:  # pragma: no cover
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):  # type: ignore[misc]
        """Records when each generated token reaches the host (the first put is the prompt)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:
                self.prompt_seen = True
                return
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    torch.manual_seed(seed)
    config = LlamaConfig(**LLAMA2_7B)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation=attn
        )
    model.eval()
    prompt = torch.randint(3, LLAMA2_7B["vocab_size"], (1, PROMPT_TOKENS), device="cuda")
    kwargs = {"max_new_tokens": OUTPUT_TOKENS, "min_new_tokens": OUTPUT_TOKENS,
              "do_sample": False, "use_cache": use_cache, "pad_token_id": 0}  # fmt: skip
    out: list[Timing] = []
    with torch.inference_mode():
        model.generate(prompt, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})  # warm-up
        torch.cuda.reset_peak_memory_stats()
        for _ in range(runs):
            stamps = Stamps()
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(prompt, streamer=stamps, **kwargs)
            out.append(timing(start, stamps.times))
        peak = torch.cuda.max_memory_allocated()
        busy_tokens = 32
        activities = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            model.generate(prompt, **{**kwargs, "max_new_tokens": busy_tokens,
                                      "min_new_tokens": busy_tokens})  # fmt: skip
            torch.cuda.synchronize()
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages())
    gpu_busy_ms = kernel_us / 1000 / busy_tokens
    versions = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "transformers": transformers.__version__}  # fmt: skip
    name = f"{attn}{'' if use_cache else ', no KV cache'}"
    del model
    torch.cuda.empty_cache()
    return summarize(name, attn, use_cache, out, peak, gpu_busy_ms, versions)


CONFIGS = {
    "eager": ("eager", True),
    "sdpa": ("sdpa", True),
    "flash_attention_2": ("flash_attention_2", True),
    "eager-no-cache": ("eager", False),
}


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", choices=sorted(CONFIGS),
                        help="attention implementation to time (repeatable; default eager and"
                        " sdpa); each runs in turn in this process: for comparisons free of"
                        " in-process drift, run one per process")  # fmt: skip
    parser.add_argument("--runs", type=int, default=5, help="timed requests per configuration")
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args(argv)
    results = []
    for name in args.config or ["eager", "sdpa"]:
        r = measure(*CONFIGS[name], args.runs)
        print(json.dumps(asdict(r)), flush=True)
        results.append(asdict(r))
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
