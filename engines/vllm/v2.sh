#!/usr/bin/env bash
# v2: vLLM with bf16 weights (PagedAttention + continuous batching), the tutorial's v2.
#
#   engines/vllm/v2.sh [extra `vllm serve` flags...]
#
# Environment (default):
#   MODEL                   checkpoint (meta-llama/Llama-3.1-8B-Instruct)
#   SERVED_MODEL_NAME       name clients send and the gateway routes (meta-llama/Llama-3.1-8B-Instruct)
#   HOST, PORT              where to listen (0.0.0.0, 8000)
#   GPU                     CUDA_VISIBLE_DEVICES for this engine (unset: what the process sees)
#   MAX_MODEL_LEN           context length (4096)
#   MAX_NUM_SEQS            running-batch limit (256)
#   GPU_MEMORY_UTILIZATION  share of the GPU's memory for weights + KV cache (0.9)
#   VLLM                    the vllm command (vllm)
# Extra arguments are passed to `vllm serve` as they are, after these flags (a repeated flag
# overrides), e.g. `--load-format dummy` for random weights or `--api-key KEY`.
set -euo pipefail

MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
SERVED_MODEL_NAME=${SERVED_MODEL_NAME:-meta-llama/Llama-3.1-8B-Instruct}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}

flags=(--dtype bfloat16)
# shellcheck source=engines/vllm/_serve.sh
. "$(dirname "${BASH_SOURCE[0]}")/_serve.sh"
