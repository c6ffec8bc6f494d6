"""One seed of a routing-sim cell: the latency engine's TPOT as its requests saw it under the
learned policy and under a fixed limit, and the learned model's knots and roofline along the run.

    TIERGATE_COMPILED=0 python docs/results/routing-sim-reach/knots.py SEED CELL LIMIT [WORKLOAD]

CELL: DEPLOYMENT,SHAPE,SLO; LIMIT: the fixed latency-tier limit to compare with (the oracle's
arm); WORKLOAD: one-off (default) or chat. Prints, per arm, the latency engine's requests that
finished in phases 3-5 (count, SLO met, geometric mean TPOT, deviation of ln TPOT, quantiles);
for the learned arm, its model at the end (spread, bias, frontier, TPOT at 4-16 streams) and,
every 10 virtual s, the TPOT knots it had seen (streams: ms / weight) with the roofline fitted to
them.
"""

from __future__ import annotations

import math
import statistics
import sys

import gateway.backends.latency_model as lm
from gateway.routing import Role
from gateway.routing.curves import KNOTS, Prediction
from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, oracle_arm, spec_of


def main() -> None:
    seed, cell, limit = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    workload = sys.argv[4] if len(sys.argv) > 4 else "one-off"
    deployment, shape, slo = cell.split(",")
    shown: dict[int, str] = {}
    predict = lm.BackendModel.prediction

    def logged(self: lm.BackendModel) -> Prediction:
        pred = predict(self)
        at = self.observed_at
        speculates = self.tps is not None and self.tps > 1.2  # the EAGLE engine
        if speculates and at is not None and int(at) % 10 == 0 and int(at) not in shown:
            points = self.tpot.points()
            weights = self.tpot.weights
            roof = lm.fit_roofline([(k, v, weights[KNOTS.index(k)]) for k, v in points])
            knots = " ".join(f"{k}:{v * 1e3:.2f}/{weights[KNOTS.index(k)]:.1f}" for k, v in points)
            shown[int(at)] = (f"{at:6.1f} s frontier {self.frontier:2d} knots {knots} | roofline "
                              f"{roof.base * 1e3:.2f} + {roof.slope * 1e3:.3f} n + "
                              f"{roof.steeper * 1e3:.3f} (n - {roof.ridge})+ ms")  # fmt: skip
        return pred

    lm.BackendModel.prediction = logged  # type: ignore[method-assign]
    print(f"{deployment} {shape} {slo} ({workload}), seed {seed}")
    for arm in (Arm("learned", "learned"), oracle_arm(limit)):
        sim = cosim._Sim(spec_of((deployment, shape, slo), arm, seed, 20.0, workload))
        sim.run()
        done = [d for d in sim.done if d.role is Role.LATENCY and d.phase in (3, 4, 5)]
        logs = [math.log(d.tpot) for d in done if d.tpot > 0]
        ms = sorted(d.tpot * 1e3 for d in done)
        quantiles = [round(ms[int(q * (len(ms) - 1))], 2) for q in (0.05, 0.25, 0.5, 0.75, 0.95)]
        mean = 1e3 * math.exp(statistics.mean(logs))
        print(f"{arm.label}: latency engine, phases 3-5: {len(done)} requests, "
              f"{sum(d.met for d in done)} met the SLO, TPOT {mean:.2f} ms (deviation of ln "
              f"{statistics.pstdev(logs):.3f}), quantiles 5/25/50/75/95% {quantiles}")  # fmt: skip
        if arm.policy == "learned":
            p = sim.registry.curves[sim.engines[0].entry.url]
            at = [round(p.tpot.at(n) * 1e3, 2) for n in (4, 8, 10, 12, 16)]
            print(f"  model at the end: spread {p.spread:.3f}, bias {p.bias:.3f}, frontier "
                  f"{p.frontier}, TPOT at 4/8/10/12/16 streams {at} ms")  # fmt: skip
            print("\n".join(shown[t] for t in sorted(shown)))


if __name__ == "__main__":
    main()
