#!/bin/bash
# `bench conversations`' phases with the gateway's defaults, one round at a time, over three
# checkouts (base: 24219c8, new: 3609523, var: 3609523 with tried/give-way-ahead-own-prefill.diff),
# the order rotated each round; run from this repository's root.
# Usage: docs/results/conversations-prefill-priced/crowd.sh ROUNDS BASE NEW VAR >> crowd.txt
rounds=$1; declare -A tree=([base]=$2 [new]=$3 [var]=$4)
arms=(base new var)
for i in $(seq 1 "$rounds"); do
  for k in 0 1 2; do
    a=${arms[$(( (i + k) % 3 ))]}
    echo -n "$i $a "
    TIERGATE_COMPILED=0 PYTHONPATH=${tree[$a]} .venv/bin/python \
      docs/results/routing-sim-prefill-share/crowd_moves.py 1 2>&1 | grep -v seqs | tail -1
  done
done
