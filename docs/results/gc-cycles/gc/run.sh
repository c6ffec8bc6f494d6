#!/bin/bash
# The cycle collector's work in the gateway over one round of `bench peers` (tiergate alone),
# before and after, alternating; then once each with what it found kept (GCPROBE_SAVE).
cd "$(git rev-parse --show-toplevel)"
i=0
for arm in before after after before save-before save-after; do
  i=$((i+1))
  case $arm in *before) git stash -q;; esac
  save=""; case $arm in save-*) save=1;; esac
  GCPROBE_SAVE=$save GCPROBE_OUT=docs/results/gc-cycles/gc/$i-$arm PYTHONPATH=docs/results/gc-cycles/probe \
    .venv/bin/tiergate bench peers --target tiergate --rounds 1 --no-install \
    --out docs/results/gc-cycles/gc/$i-$arm-peers/peers.json > docs/results/gc-cycles/gc/$i-$arm.log 2>&1
  case $arm in *before) git stash pop -q;; esac
  echo "$i $arm done $(date +%T)"
done
