"""What the latency engine's requests met in one seed of a routing-sim cell under fixed
latency-tier limits (the oracle's arms): per phase, the requests it served, the share within
the SLO and their TPOT's spread.

    python docs/results/roofline-noise-tried/truth.py DEPLOYMENT/SHAPE/SLO WORKLOAD L1,L2,..."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.types import Role
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import oracle_arm, spec_of


def main() -> None:
    deployment, shape, slo = sys.argv[1].split("/")
    for limit in (int(x) for x in sys.argv[3].split(",")):
        spec = spec_of((deployment, shape, slo), oracle_arm(limit), 0, 20.0, sys.argv[2])
        r = simulate(spec)
        for k in range(len(spec.users)):
            fast = [d for d in r.done if d.phase == k and d.role is Role.LATENCY]
            if not fast:
                continue
            tp = sorted(d.tpot * 1e3 for d in fast)
            met = sum(d.met for d in fast) / len(fast)
            print(
                f"L={limit} phase {k}: {len(fast)} requests, {met:.2f} within the SLO, TPOT "
                f"p10 {tp[len(tp) // 10]:.1f} p50 {tp[len(tp) // 2]:.1f} "
                f"p90 {tp[len(tp) * 9 // 10]:.1f} mean {statistics.fmean(tp):.1f} ms"
            )


if __name__ == "__main__":
    main()
