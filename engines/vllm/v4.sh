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
HOST=${HOST:-0.0.0.0}
PORT=${PORT:-8000}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-16}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.9}
VLLM=${VLLM:-vllm}

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

if [[ -n "${GPU:-}" ]]; then
    export CUDA_VISIBLE_DEVICES=$GPU
fi
if ! command -v "$VLLM" >/dev/null; then
    echo "v4.sh: '$VLLM' not found (pip install vllm, or set VLLM=/path/to/vllm)" >&2
    exit 127
fi

exec "$VLLM" serve "$MODEL" \
    --served-model-name "$SERVED_MODEL_NAME" \
    "${quantization[@]}" \
    --speculative-config "$spec_config" \
    --max-model-len "$MAX_MODEL_LEN" \
    --max-num-seqs "$MAX_NUM_SEQS" \
    --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION" \
    --host "$HOST" \
    --port "$PORT" \
    "$@"
