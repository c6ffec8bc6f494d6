"""The latency tier's TPOT knots (knot, value ms, weight), the roofline fitted to them (base ms,
slope ms/stream, steeper ms/stream, ridge) and the frontier, every 2 virtual seconds of one
run of the learned policy; with `--readings`, every TPOT reading past LO streams there (the
engine's scrapes and the finished streams). From the repository's root:

    PYTHONPATH=. python docs/results/knot-neighbour/knots.py little burst interactive chat 2
    PYTHONPATH=. python docs/results/knot-neighbour/knots.py ... 2 --readings 4.3
"""

import sys
import traceback

from gateway.backends import latency_model as lm
from gateway.routing.curves import KNOTS
from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of

dep, shape, slo, workload, seed = sys.argv[1:6]
readings = "--readings" in sys.argv
low = float(sys.argv[sys.argv.index("--readings") + 1]) if readings else 0.0
sim = cosim._Sim(spec_of((dep, shape, slo), Arm("learned", "learned"), int(seed), 20.0, workload))
latency: set[int] = set()
observe = lm.CurveLearner.observe


def traced(self: lm.CurveLearner, n: float, y: float, weight: float = 1.0) -> bool:
    if readings and id(self) in latency and n > low:
        source = traceback.extract_stack(limit=3)[0].name
        print(f"t={sim.now:7.2f} {source} n={n:.2f} TPOT {y * 1000:.2f} ms")
    return observe(self, n, y, weight)


lm.CurveLearner.observe = traced  # type: ignore[method-assign]
scrape = sim.scrape


def scraped() -> None:
    for url, m in sim.learner.models.items():
        if "latency" in url:
            latency.add(id(m.tpot))
    scrape()
    if readings or int(sim.now * 4) % 8:
        return
    for url, m in sim.learner.models.items():
        points = m.tpot.points()
        if "latency" not in url or not points:
            continue
        w = {k: m.tpot.weights[KNOTS.index(k)] for k, _ in points}
        roof = lm.fit_roofline([(k, v, w[k]) for k, v in points])
        knots = [(k, round(v * 1000, 2), round(w[k], 1)) for k, v in points]
        print(f"t={sim.now:6.2f} frontier {m.frontier} knots {knots} roofline "
              f"({roof.base * 1000:.2f}, {roof.slope * 1000:.3f}, {roof.steeper * 1000:.3f}, "
              f"{roof.ridge})")


sim.scrape = scraped  # type: ignore[method-assign]
sim.run()
