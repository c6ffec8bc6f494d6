"""The client-seen TPOT of the requests the latency engine served, per phase of one cell of
`bench routing-sim`, under the learned policy and fixed latency-tier limits.

Usage: python tpot_by_limit.py WORKLOAD DEPLOYMENT/SHAPE/SLO SEED learned|LIMIT ..."""

import sys

from gateway.routing.types import Role
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, oracle_arm, spec_of


def main() -> None:
    workload, cell, seed = sys.argv[1], tuple(sys.argv[2].split("/")), int(sys.argv[3])
    for arm_name in sys.argv[4:]:
        arm = Arm("learned", "learned") if arm_name == "learned" else oracle_arm(int(arm_name))
        r = simulate(spec_of(cell, arm, seed, 20.0, workload))  # type: ignore[arg-type]
        for phase, load in enumerate(r.phase_load):
            served = [d for d in r.done if d.phase == phase and d.role == Role.LATENCY]
            if not served:
                continue
            tpot = sorted(d.tpot * 1e3 for d in served)
            ttft = sorted(d.ttft * 1e3 for d in served)
            at = [round(tpot[int(len(tpot) * q)], 1) for q in (0.1, 0.5, 0.9)]
            print(f"{arm_name} phase {phase} eagle load {next(iter(load.values())):.1f} "
                  f"n {len(served)} met {sum(d.met for d in served)} tpot p10/50/90 {at} "
                  f"ttft p50 {round(ttft[len(ttft) // 2])}")  # fmt: skip


if __name__ == "__main__":
    main()
