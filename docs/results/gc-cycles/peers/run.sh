#!/bin/bash
# Before (the change stashed) and after, alternating: `bench peers`, tiergate and vLLM's router.
cd "$(git rev-parse --show-toplevel)"
i=0
for arm in before after after before; do
  i=$((i+1))
  if [ $arm = before ]; then git stash -q; fi
  .venv/bin/tiergate bench peers --target tiergate --target vllm-router --rounds 3 --no-install --out docs/results/gc-cycles/peers/$i-$arm/peers.json > docs/results/gc-cycles/peers/$i-$arm.log 2>&1
  if [ $arm = before ]; then git stash pop -q; fi
  echo "$i $arm done $(date +%T)"
done
