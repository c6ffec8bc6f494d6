#!/usr/bin/env bash
# The crowd phase of `bench conversations` (after its 12 chats one at a time), 2bf0213 against
# this checkout, one fresh deployment per arm and round, the order alternating each round. Each
# arm runs from inside its own checkout, so that its gateway is that checkout's whatever the
# harness (before acd16a3 the harness started the gateway with the working directory first on
# sys.path).
# Usage (repository root, venv active): docs/results/conversations-guess/ab-crowd.sh ROUNDS
# Needs a checkout of 2bf0213 at /tmp/wt0 (git worktree add /tmp/wt0 2bf0213 --detach).
set -euo pipefail
here=$(pwd)
crowd="$here/docs/results/routing-sim-prefill-wave/tried/crowd.py"
for ((r = 0; r < $1; r++)); do
  if ((r % 2)); then order="head 2bf0213"; else order="2bf0213 head"; fi
  for arm in $order; do
    if [[ $arm == head ]]; then path=$here; else path=/tmp/wt0; fi
    echo "$r $arm $(cd "$path" && PYTHONPATH=$path python "$crowd" 1 | cut -d' ' -f2-)"
  done
done
