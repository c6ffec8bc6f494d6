"""Each engine's TPOT knots, their isotonic fit and the roofline fitted to them, at given
virtual times of one seed of a routing-sim cell run with the learned policy (the engines in
the order of their URLs; a speculative one says so).

    cd docs/results/routing-sim-reach && TIERGATE_COMPILED=0 python \
        ../roofline-noise-tried/knots.py SEED DEPLOYMENT,SHAPE,SLO WORKLOAD T1,T2,...

Each knot as knot:value_ms/observations."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "routing-sim-reach"))
from window import learned_run

import gateway.backends.latency_model as lm
import gateway.backends.learner as learner
import gateway.routing.learned as learned
from gateway.routing.curves import KNOTS
from gateway.routing.types import Decision, LoadSnapshot, RouteRequest, RouterState


def main() -> None:
    seed, cell, workload = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    todo = [float(x) for x in sys.argv[4].split(",")]
    learners: list[learner.Learner] = []
    made, decide = learner.Learner.__init__, learned.Learned.__call__

    def kept(self: learner.Learner, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        learners.append(self)

    def logged(self: Any, req: RouteRequest, snap: LoadSnapshot, state: RouterState,
               rng: random.Random) -> Decision:  # fmt: skip
        if todo and snap.taken_at >= todo[0]:
            todo.pop(0)
            for url, m in sorted(learners[-1].models.items()):
                t, pts = m.tpot, m.tpot.points()
                roof = lm.fit_roofline([(k, v, t.weights[KNOTS.index(k)]) for k, v in pts])
                kind = " (speculative)" if m.tps and m.tps > 1.05 else ""
                print(f"t={snap.taken_at:.1f} {url} frontier={m.frontier}{kind}")
                print("  knots:", " ".join(f"{KNOTS[i]}:{t.values[i] * 1e3:.2f}/{t.seen[i]:.0f}"
                                           for i in range(len(KNOTS)) if t.seen[i]))  # fmt: skip
                print("  isotonic:", " ".join(f"{k}:{v * 1e3:.2f}" for k, v in pts))
                print(
                    f"  roofline: base {roof.base * 1e3:.2f} ms, slope {roof.slope * 1e3:.4f}"
                    f" ms a stream, steeper {roof.steeper * 1e3:.4f} past {roof.ridge}"
                )
        return decide(self, req, snap, state, rng)

    learner.Learner.__init__ = kept  # type: ignore[method-assign]
    learned.Learned.__call__ = logged  # type: ignore[method-assign]
    print(learned_run(seed, cell, workload))


if __name__ == "__main__":
    main()
