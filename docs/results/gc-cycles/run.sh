#!/bin/bash
# This tree (HEAD) against 3677883, alternating (before / after / after / before): for each arm
# the gateway's sources (gateway/) of that commit, then `bench peers` with tiergate and vLLM's
# router (3 rounds), then one round of tiergate alone under the collector's probe.
# From the repository's root, the tree clean: bash docs/results/gc-cycles/run.sh [OUT]
set -e
cd "$(git rev-parse --show-toplevel)"
out=${1:-docs/results/gc-cycles/final}
after=$(git rev-parse --short HEAD)
i=0
for arm in before after after before; do
  i=$((i+1))
  if [ $arm = before ]; then git checkout -q 3677883 -- gateway; fi
  .venv/bin/tiergate bench peers --target tiergate --target vllm-router --rounds 3 \
    --no-install --out $out/$i-$arm/peers.json > /dev/null 2>&1
  GCPROBE_OUT=$out/$i-$arm/gc PYTHONPATH=docs/results/gc-cycles/probe \
    .venv/bin/tiergate bench peers --target tiergate --rounds 1 --no-install \
    --out /tmp/gc-cycles-probe/peers.json > /dev/null 2>&1
  for f in $out/$i-$arm/gc.*; do mv "$f" $out/$i-$arm/gc.txt; done
  if [ $arm = before ]; then git checkout -q "$after" -- gateway; fi
  echo "$i $arm done $(date +%T)"
done
git status --short gateway
