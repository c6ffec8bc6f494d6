#!/usr/bin/env bash
# v3: vLLM with AWQ INT4 weights (14 GB -> 4 GB, the freed memory goes to the KV cache), the
# tutorial's v3 and tiergate's throughput pool.
#
#   engines/vllm/v3.sh [extra `vllm serve` flags...]
#
# Environment (default):
#   MODEL                   AWQ checkpoint (hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4)
#   SERVED_MODEL_NAME       name clients send and the gateway routes (meta-llama/Llama-3.1-8B-Instruct)
#   QUANTIZATION            awq_marlin (fast Marlin kernels, Ampere or newer) or awq (awq_marlin)
#   HOST, PORT              where to listen (0.0.0.0, 8000)
#   GPU                     CUDA_VISIBLE_DEVICES for this engine (unset: what the process sees)
#   MAX_MODEL_LEN           context length (4096)
#   MAX_NUM_SEQS            running-batch limit, raised since memory freed up (384)
#   GPU_MEMORY_UTILIZATION  share of the GPU's memory for weights + KV cache (0.9)
#   VLLM                    the vllm command (vllm)
# Extra arguments are passed to `vllm serve` as they are, after these flags (a repeated flag
# overrides), e.g. `--load-format dummy` for random weights or `--api-key KEY`.
set -euo pipefail

MODEL=${MODEL:-hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4}
SERVED_MODEL_NAME=${SERVED_MODEL_NAME:-meta-llama/Llama-3.1-8B-Instruct}
QUANTIZATION=${QUANTIZATION:-awq_marlin}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-384}

case "$QUANTIZATION" in
    awq | awq_marlin) ;;
    *)
        echo "v3.sh: QUANTIZATION must be awq or awq_marlin, got '$QUANTIZATION'" >&2
        exit 2
        ;;
esac
flags=(--quantization "$QUANTIZATION" --dtype float16)
# shellcheck source=engines/vllm/_serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/_serve.sh"
