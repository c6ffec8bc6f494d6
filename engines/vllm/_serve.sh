# shellcheck shell=bash disable=SC2154  # flags, MODEL...: set by the sourcing script
# Sourced by v2.sh, v3.sh and v4.sh once they have set MODEL, SERVED_MODEL_NAME, MAX_NUM_SEQS and
# their own flags (the array `flags`): the settings the three share, then `vllm serve` with the
# script's arguments last (a repeated flag overrides).
HOST=${HOST:-0.0.0.0}
PORT=${PORT:-8000}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.9}
VLLM=${VLLM:-vllm}

if [[ -n "${GPU:-}" ]]; then
    export CUDA_VISIBLE_DEVICES=$GPU
fi
if ! command -v "$VLLM" >/dev/null; then
    echo "${0##*/}: '$VLLM' not found (pip install vllm, or set VLLM=/path/to/vllm)" >&2
    exit 127
fi

exec "$VLLM" serve "$MODEL" \
    --served-model-name "$SERVED_MODEL_NAME" \
    "${flags[@]}" \
    --max-model-len "$MAX_MODEL_LEN" \
    --max-num-seqs "$MAX_NUM_SEQS" \
    --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION" \
    --host "$HOST" \
    --port "$PORT" \
    "$@"
