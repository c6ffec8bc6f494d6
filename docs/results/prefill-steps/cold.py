"""From a cold start, when the learned policy's SLO-met requests reach 95% of the best fixed
limit's for good (the study's `settled_s`: its windows against the oracle's of a stored run),
for the cells of one deployment, the learned policy of the tree on PYTHONPATH run again over the
stored run's seeds. From the repository's root:

    PYTHONPATH=. python docs/results/prefill-steps/cold.py STUDY.json DEPLOYMENT WORKLOAD
"""

import json
import multiprocessing as mp
import sys
from pathlib import Path

from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import ORACLE_SHARE, Arm, settled_at, spec_of, summarize


def windows(task: tuple[tuple[str, str, str], int, str]) -> list[int]:
    cell, seed, workload = task
    spec = spec_of(cell, Arm("learned", "learned"), seed, 20.0, workload)
    return summarize(simulate(spec)).windows


if __name__ == "__main__":
    path, deployment, workload = sys.argv[1:4]
    report = json.loads(Path(path).read_text())
    seeds = report["options"]["seeds"]
    for c in report["cells"]:
        if c["deployment"] != deployment:
            continue
        cell = (c["deployment"], c["shape"], c["slo"])
        with mp.Pool(2) as pool:
            runs = pool.map(windows, [(cell, s, workload) for s in range(seeds)])
        mine = [sum(w) for w in zip(*runs, strict=True)]
        theirs = c["sweep"][str(c["oracle"]["limit"])]["windows"]
        print(f"{'/'.join(cell)}: settled at {settled_at(mine, theirs, ORACLE_SHARE)} s "
              f"(stored run: {c['settled_s']} s), {seeds} seeds")
