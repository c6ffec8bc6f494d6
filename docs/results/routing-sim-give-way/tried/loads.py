"""The learned policy's mean streams per engine in each phase of one cell of `bench routing-sim`
(latency engine first, then the pool's), seed by seed.

Usage: python loads.py WORKLOAD DEPLOYMENT/SHAPE/SLO SEEDS"""

import sys

from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, spec_of


def main() -> None:
    workload, cell, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    deployment, shape, slo = cell.split("/")
    for seed in range(seeds):
        r = simulate(spec_of((deployment, shape, slo), Arm("learned", "learned"), seed, 20.0,
                             workload))  # fmt: skip
        met = sum(d.met for d in r.done if d.phase is not None)
        phases = " | ".join(" ".join(f"{v:.1f}" for v in p.values()) for p in r.phase_load)
        print(f"{cell} seed {seed}: {met} SLO-met; streams per phase: {phases}")


if __name__ == "__main__":
    main()
