"""What the learned policy's sharing among a tier's replicas saw in one seed of a routing-sim
cell: at each decision where a candidate holds 8 streams or more and the first choice is past
its frontier, every candidate's streams, gain and envelope (gateway.routing.learned.envelope),
and the first choice before and after (the first 40 such decisions).

    cd docs/results/routing-sim-reach && TIERGATE_COMPILED=0 python \\
        ../roofline-noise-tried/envelopes.py SEED DEPLOYMENT,SHAPE,SLO WORKLOAD"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "routing-sim-reach"))
from window import learned_run

import gateway.routing.learned as learned


def main() -> None:
    seed, cell, workload = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    share, shown = learned._share_with_mates, [0]

    def traced(keys: Any, pool: Any, outlooks: Any, preds: Any, context: Any) -> None:
        loads, slo = context
        before = keys[0][-1]
        share(keys, pool, outlooks, preds, context)
        if shown[0] >= 40 or not any(o[5] >= 8 for o in outlooks):
            return
        shown[0] += 1
        parts = []
        for k in keys:
            i = k[-1]
            o, p = outlooks[i], preds[i]
            e = learned.envelope(p, loads[i], o[5], slo, o[3]) if p and p.frontier else None
            env = "-" if e is None else f"{e:.1f}"
            name = pool[i].url.removeprefix("http://").removesuffix(".sim")
            parts.append(f"{name} n={o[5]} gain={o[3]:.1f} envelope={env}")
        first = pool[before].url.removeprefix("http://").removesuffix(".sim")
        after = pool[keys[0][-1]].url.removeprefix("http://").removesuffix(".sim")
        print(f"{first} -> {after} | " + " | ".join(parts))

    learned._share_with_mates = traced
    print(learned_run(seed, cell, workload))


if __name__ == "__main__":
    main()
