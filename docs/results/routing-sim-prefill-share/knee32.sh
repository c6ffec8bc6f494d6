#!/usr/bin/env bash
# knee-32's tight cells of the one-off H200 study, seeds 0-7, the learned policy alone: this
# checkout (PYTHONPATH=.) and one with prompt-own-stall.diff applied at /tmp/wty.
# Usage (repository root, venv active): docs/results/routing-sim-prefill-share/knee32.sh
set -euo pipefail
for wt in . /tmp/wty; do
  echo "== $wt"
  PYTHONPATH=$wt python docs/results/routing-sim-give-way/tried/learned_only.py \
    docs/results/routing-sim-prefill/oneoff-h200/routing-sim.json one-off 8 \
    knee-32/burst/tight,knee-32/step/tight | grep -v total
done
