"""The affinity stage's decisions in one run of `bench routing-sim --workload chat`, counted by
the request's home, the policy's first choice and where the request went (l0: the latency
engine, t0/t1: the pool's, --: no home), with the reason the policy gave.

Usage: python decisions.py DEPLOYMENT/SHAPE/SLO SEED FROM_S TO_S (virtual seconds)."""

import sys
from collections import Counter
from typing import Any

from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of


def short(url: str | None) -> str:
    return "--" if url is None else url[7] + url.split("-")[-1][0]


def main() -> None:
    deployment, shape, slo = sys.argv[1].split("/")
    seed, start, end = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    sim = cosim._Sim(spec_of((deployment, shape, slo), Arm("learned", "learned"), seed, 20.0,
                             "chat"))  # fmt: skip
    stage = sim.router.affinity
    assert stage is not None
    seen: Counter[tuple[str, str, str, str]] = Counter()

    def logged(req: Any, decision: Any, snap: Any) -> Any:
        out = stage(req, decision, snap)
        if start <= sim.now <= end:
            seen[short(req.home), short(decision.primary.url), short(out.primary.url),
                 str(decision.reason)] += 1  # fmt: skip
        return out

    sim.router.affinity = logged  # type: ignore[assignment]
    sim.run()
    for (home, chosen, went, reason), count in seen.most_common():
        print(count, "home", home, "policy", chosen, "->", went, reason)


if __name__ == "__main__":
    main()
