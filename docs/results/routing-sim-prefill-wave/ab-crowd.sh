#!/usr/bin/env bash
# The crowd phase of `bench conversations` (after its chats one at a time), a3e5cac against
# this checkout, one fresh deployment per arm and round, the order alternating each round.
# Usage (from the repository root, the venv active): docs/results/routing-sim-prefill-wave/ab-crowd.sh ROUNDS
# Needs a checkout of a3e5cac at /tmp/wt0 (git worktree add /tmp/wt0 a3e5cac --detach).
set -euo pipefail
here=$(pwd)
crowd="$here/docs/results/routing-sim-prefill-wave/tried/crowd.py"
for ((r = 0; r < $1; r++)); do
  if ((r % 2)); then order="head a3e5cac"; else order="a3e5cac head"; fi
  for arm in $order; do
    if [[ $arm == head ]]; then path=$here; else path=/tmp/wt0; fi
    echo "$r $arm $(PYTHONPATH=$path python "$crowd" 1 | cut -d' ' -f2-)"
  done
done
