#!/usr/bin/env bash
# guidellm and inference-perf, two benchmark clients of the field, against `tiergate up` (the
# gateway in front of the simulated tiers): each streams 40 completions of 50-token prompts and
# 32-token answers; summarize.py checks no request failed and every length was exact, by each
# client's count, by the words sent and received, and by the usage the gateway relayed.
#
#   scripts/field-clients/run.sh [OUT]        (default OUT: docs/results/field-clients)
#
# Each client gets its own environment (their dependencies pin versions the gateway's do not):
# .venv-guidellm (guidellm 0.8.1; it needs PyTorch: set GUIDELLM_TORCH to a requirement such as
# torch==2.13.0 to install a CPU build first, or pip takes the CUDA build of several GB) and
# .venv-inference-perf (inference-perf 0.7.0, which needs Python >= 3.12: PYTHON312, default
# python3.12 on the PATH). The aiperf smoke test of the suite covers the third client.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/scripts/field-clients"
out=$(realpath -m "${1:-$root/docs/results/field-clients}")
cd "$root"
[ -x .venv/bin/python ] || . scripts/_venv.sh dev
if [ ! -x .venv-guidellm/bin/guidellm ]; then
    python3 -m venv .venv-guidellm
    [ -n "${GUIDELLM_TORCH:-}" ] && .venv-guidellm/bin/pip install -q "$GUIDELLM_TORCH"
    .venv-guidellm/bin/pip install -q "guidellm==0.8.1"
fi
if [ ! -x .venv-inference-perf/bin/inference-perf ]; then
    "${PYTHON312:-python3.12}" -m venv .venv-inference-perf
    .venv-inference-perf/bin/pip install -q "inference-perf==0.7.0"
fi
rm -rf "$out/guidellm" "$out/inference-perf"
mkdir -p "$out/guidellm" "$out/inference-perf"
work=$(mktemp -d)
port=$(.venv/bin/python -c "from loadtests.harness.procs import free_port; print(free_port())")
sim=$(.venv/bin/python -c "from tests.e2e.test_cli import _free_pair; print(_free_pair($port))")
model=$(.venv/bin/python -c "from tests.e2e.test_cli import MODEL; print(MODEL)")
.venv/bin/python -m tiergate up --port "$port" --sim-port "$sim" --speedup 20 \
    --logs "$work/logs" >"$work/up.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$work"' EXIT
.venv/bin/python -c "from loadtests.harness.procs import wait_http; \
wait_http('http://127.0.0.1:$port/ready', timeout=60)"
echo "tiergate up on :$port; building the tokenizer"
.venv-guidellm/bin/python "$here/tokenizer.py" "$work/tokenizer"
fill() { sed -e "s|TARGET|http://127.0.0.1:$port|; s|MODEL|$model|; s|TOKENIZER|$work/tokenizer|" \
             -e "s|OUT/|$out/|" "$1" >"$2"; }
fill "$here/guidellm.json" "$work/guidellm.json"
fill "$here/inference-perf.yml" "$work/inference-perf.yml"
echo "guidellm $(.venv-guidellm/bin/pip show guidellm | sed -n 's/^Version: //p')"
.venv-guidellm/bin/guidellm run -c "$work/guidellm.json" --disable-console-interactive \
    >"$out/guidellm/console.txt" 2>&1
echo "inference-perf $(.venv-inference-perf/bin/pip show inference-perf | sed -n 's/^Version: //p')"
.venv-inference-perf/bin/inference-perf -c "$work/inference-perf.yml" \
    >"$out/inference-perf/console.txt" 2>&1
header="Command: \`scripts/field-clients/run.sh\`. Date: $(date -u +%FT%TZ). Code: commit \
$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- gateway engines tiergate || echo ' with uncommitted changes'). \
guidellm $(.venv-guidellm/bin/pip show guidellm | sed -n 's/^Version: //p'), inference-perf \
$(.venv-inference-perf/bin/pip show inference-perf | sed -n 's/^Version: //p'); \`tiergate up\` with its defaults, --speedup 20."
.venv/bin/python "$here/summarize.py" "$out" "$header" "$work"
