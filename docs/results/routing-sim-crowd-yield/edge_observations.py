"""Every observation the TPOT curves learn in one cell of `bench routing-sim` (learned policy),
by engine (L: the latency engine, with more than 1.2 tokens a step; P: a pool engine), source (a
scrape interval or a finished stream) and rounded streams, as step times in ms; "raw" lines:
the latency engine's past 6.4 streams, one by one.

Usage: python edge_observations.py WORKLOAD DEPLOYMENT/SHAPE/SLO SEED"""

import collections
import statistics
import sys
from typing import Any

from gateway.backends import latency_model as lm
from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of

seen: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
now: dict[str, Any] = {"source": None, "model": None}
_request, _engine, _observe = (lm.BackendModel.observe_request, lm.BackendModel.observe_engine,
                               lm.CurveLearner.observe)  # fmt: skip


def observe_request(self: Any, *args: Any, **kw: Any) -> None:
    now.update(source="stream", model=self)
    _request(self, *args, **kw)
    now["source"] = None


def observe_engine(self: Any, *args: Any, **kw: Any) -> None:
    now.update(source="interval", model=self)
    _engine(self, *args, **kw)
    now["source"] = None


def observe(self: Any, n: float, y: float, weight: float = 1.0) -> bool:
    m = now["model"]
    if m is not None and self is m.tpot and now["source"]:
        tps = m.tps or 1.0
        engine = "L" if tps > 1.2 else "P"
        seen[(engine, now["source"], round(n))].append(y * tps * 1e3)
        if engine == "L" and n > 6.4:
            print("raw", now["source"], round(n, 2), round(y * tps * 1e3, 2))
    return bool(_observe(self, n, y, weight))


def main() -> None:
    lm.BackendModel.observe_request = observe_request  # type: ignore[method-assign]
    lm.BackendModel.observe_engine = observe_engine  # type: ignore[method-assign]
    lm.CurveLearner.observe = observe  # type: ignore[method-assign]
    workload, cell, seed = sys.argv[1], tuple(sys.argv[2].split("/")), int(sys.argv[3])
    cosim._Sim(spec_of(cell, Arm("learned", "learned"), seed, 20.0, workload)).run()  # type: ignore[arg-type]
    for key in sorted(seen):
        v = seen[key]
        print(key, len(v), "median", round(statistics.median(v), 2), "mean",
              round(statistics.mean(v), 2))  # fmt: skip


if __name__ == "__main__":
    main()
