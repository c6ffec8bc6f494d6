#!/usr/bin/env bash
# v4: vLLM with AWQ INT4 weights + EAGLE-3 speculative decoding (5 draft tokens), the
# tutorial's v4 and tiergate's latency tier. The batch is kept small on purpose: speculation
# pays off at <= 16 concurrent streams, breaks even near 32 and loses beyond.
#
#   engines/vllm/v4.sh [extra `vllm serve` flags...]
#
# Environment (default):
#   MODEL                   target checkpoint (hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4)
#   DRAFT_MODEL             draft head trained for MODEL (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)
#   SPEC_METHOD             eagle3 for EAGLE-3 heads, eagle for EAGLE-1 heads (eagle3)
#   NUM_SPECULATIVE_TOKENS  draft tokens per step (5)
#   SERVED_MODEL_NAME       name clients send and the gateway routes (meta-llama/Llama-3.1-8B-Instruct)
#   QUANTIZATION            awq_marlin, awq, or none for a bf16 MODEL (awq_marlin)
#   HOST, PORT              where to listen (0.0.0.0, 8000)
#   GPU                     CUDA_VISIBLE_DEVICES for this engine (unset: what the process sees)
#   MAX_MODEL_LEN           context length (4096)
#   MAX_NUM_SEQS            running-batch limit (16)
#   GPU_MEMORY_UTILIZATION  share of the GPU's memory for weights + KV cache (0.9)
#   VLLM                    the vllm command (vllm)
# Extra arguments are passed to `vllm serve` as they are, after these flags (a repeated flag
# overrides), e.g. `--load-format dummy` for random weights or `--api-key KEY`.
set -euo pipefail

MODEL=${MODEL:-hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4}
DRAFT_MODEL=${DRAFT_MODEL:-yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}
SPEC_METHOD=${SPEC_METHOD:-eagle3}
NUM_SPECULATIVE_TOKENS=${NUM_SPECULATIVE_TOKENS:-5}
SERVED_MODEL_NAME=${SERVED_MODEL_NAME:-meta-llama/Llama-3.1-8B-Instruct}
QUANTIZATION=${QUANTIZATION:-awq_marlin}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-16}

fail() {
    echo "v4.sh: $*" >&2
    exit 2
}
[[ "$NUM_SPECULATIVE_TOKENS" =~ ^[1-9][0-9]*$ ]] ||
    fail "NUM_SPECULATIVE_TOKENS must be a positive integer, got '$NUM_SPECULATIVE_TOKENS'"
# Both go into a JSON string as they are: allow what Hugging Face ids and plain paths use.
[[ "$DRAFT_MODEL" =~ ^[A-Za-z0-9._/@:+-]+$ ]] || fail "unexpected characters in DRAFT_MODEL"
[[ "$SPEC_METHOD" =~ ^[a-z0-9_]+$ ]] || fail "unexpected SPEC_METHOD '$SPEC_METHOD'"

quantization=()
case "$QUANTIZATION" in
    awq | awq_marlin) quantization=(--quantization "$QUANTIZATION" --dtype float16) ;;
    none | "") ;;
    *) fail "QUANTIZATION must be awq, awq_marlin or none, got '$QUANTIZATION'" ;;
esac
spec_config=$(printf '{"method":"%s","model":"%s","num_speculative_tokens":%d}' \
    "$SPEC_METHOD" "$DRAFT_MODEL" "$NUM_SPECULATIVE_TOKENS")

flags=("${quantization[@]}" --speculative-config "$spec_config")
# shellcheck source=engines/vllm/_serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/_serve.sh"
