#!/bin/sh
# crowd_outcomes.py one round at a time in two checkouts, alternating, the first of each pair
# rotating: ./interleave.sh ROUNDS BASE NEW (the checkouts' roots; the venv of the current one).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
rounds=$1 base=$2 new=$3
i=0
while [ "$i" -lt "$rounds" ]; do
  if [ $((i % 2)) -eq 0 ]; then order="$base $new"; else order="$new $base"; fi
  for tree in $order; do
    name=$( [ "$tree" = "$base" ] && echo base || echo new )
    printf '%s ' "$name"
    (cd "$tree" && TIERGATE_COMPILED=0 PYTHONPATH="$tree" python "$here/crowd_outcomes.py" 1 | head -1)
  done
  i=$((i + 1))
done
