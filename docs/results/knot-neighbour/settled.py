"""When the learned policy's SLO-met requests per window reach 95% of the stored oracle's for
good (`settled_s`, as `tiergate bench routing-sim` reports it), the stored study's seeds
pooled, for the named cells. From the repository's root:

    PYTHONPATH=. python docs/results/knot-neighbour/settled.py STUDY.json WORKLOAD CELL[,CELL]
"""

import json
import sys

from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import ORACLE_SHARE, Arm, settled_at, spec_of, summarize

path, workload, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
with open(path) as f:
    report = json.load(f)
seeds = report["options"]["seeds"]
for c in report["cells"]:
    cell = (c["deployment"], c["shape"], c["slo"])
    if "/".join(cell) not in names:
        continue
    runs = [summarize(simulate(spec_of(cell, Arm("learned", "learned"), s, 20.0, workload)))
            for s in range(seeds)]  # fmt: skip
    windows = [sum(w) for w in zip(*(r.windows for r in runs), strict=True)]
    oracle = c["sweep"][str(c["oracle"]["limit"])]["windows"]
    now = settled_at(windows, oracle, ORACLE_SHARE)
    print("/".join(cell), "stored", c["settled_s"], "now", now, "first windows", windows[:6],
          "oracle's", oracle[:6], flush=True)  # fmt: skip
