#!/bin/bash
# The learned policy alone over the stored chat runs (4 seeds), in two checkouts: BEFORE (here
# 24219c8) and AFTER (3609523), each from its own sources; run from this repository's root.
# Usage: docs/results/conversations-prefill-priced/study.sh BEFORE AFTER OUTDIR
set -e
root=$(pwd) before=$1 after=$2 out=$3
for job in "chat-h200 docs/results/routing-sim-prefill/chat-h200/routing-sim.json" \
           "chat-a100 docs/results/routing-sim-prefill-wave/chat-a100/routing-sim.json"; do
  set -- $job
  for arm in after before; do
    tree=$before; [ $arm = after ] && tree=$after
    (cd "$tree" && PYTHONPATH="$tree" TIERGATE_COMPILED=0 "$root/.venv/bin/python" \
      docs/results/routing-sim-give-way/tried/learned_only.py "$root/$2" chat 4 > "$out/$1-$arm.txt")
  done
done
