"""The latency engine's TPOT knots (step time, ms), their weights and its cost per prompt
token, at virtual second AT of one cell of `bench routing-sim` (learned policy).

Usage: python knots.py WORKLOAD DEPLOYMENT/SHAPE/SLO SEED AT"""

import sys
from typing import Any

from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of


def main() -> None:
    workload, cell, seed = sys.argv[1], tuple(sys.argv[2].split("/")), int(sys.argv[3])
    at = float(sys.argv[4])
    sim = cosim._Sim(spec_of(cell, Arm("learned", "learned"), seed, 20.0, workload))  # type: ignore[arg-type]
    send = sim.send
    shown: list[bool] = []

    def hook(user: int) -> None:
        if sim.now >= at and not shown:
            shown.append(True)
            learners: list[Any] = [v for k, v in vars(sim).items() if "learn" in k.lower()]
            for learner in learners:
                for url, m in (getattr(learner, "models", None) or {}).items():
                    if "latency" not in url:
                        continue
                    tps = m.tps or 1.0
                    print(url, "frontier", m.frontier, "tps", tps, "prefill c", m.prefill.per_token)
                    print(" points", [(k, round(v * 1e3 * tps, 2)) for k, v in m.tpot.points()])
                    print(" weights", [round(w, 1) for w in m.tpot.weights])
        send(user)

    sim.send = hook  # type: ignore[method-assign]
    sim.run()


if __name__ == "__main__":
    main()
