"""One seed of a routing-sim cell (one-off prompts) with the learned policy: every decision in
the first half second of a phase, and the requests the latency tier finished in the 8 s after
its start that missed their SLO.

    TIERGATE_COMPILED=0 python docs/results/routing-sim-reach/burst.py [SEED] [CELL] [AT_S]

CELL: DEPLOYMENT,SHAPE,SLO. Run from the root of the tree whose gateway it measures, on the
routing sources (TIERGATE_COMPILED=0: the compiled policy cannot be wrapped to log). AT_S: the
phase's start (virtual s; 20 for the first burst of the `burst` shape at 20-s phases). Prints,
per decision, the backend's role, the streams it held and its frontier.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import gateway.routing.learned as learned
from gateway.routing.types import Decision, LoadSnapshot, RouteRequest, RouterState
from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    cell = sys.argv[2] if len(sys.argv) > 2 else "a-lot,burst,interactive"
    at = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    deployment, shape, slo = cell.split(",")
    seen: list[tuple[float, str, str, int, int]] = []
    decide = learned.Learned.__call__

    def logged(
        self: Any, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        d = decide(self, req, snap, state, rng)
        if d.candidates and at <= snap.taken_at <= at + 0.5:
            b = d.candidates[0]
            pred, load = snap.curves.get(b.url), snap.by_url.get(b.url)
            streams = load.effective if load is not None else 0
            seen.append((snap.taken_at, str(b.role), str(d.reason), streams,
                         pred.frontier if pred is not None else 0))  # fmt: skip
        return d

    learned.Learned.__call__ = logged  # type: ignore[method-assign]
    spec = spec_of((deployment, shape, slo), Arm("learned", "learned"), seed, 20.0, "one-off")
    sim = cosim._Sim(spec)
    sim.run()
    print(f"{deployment} {shape} {slo}, seed {seed}: decisions {at:.1f}-{at + 0.5:.1f} s")
    for t, role, reason, streams, frontier in seen:
        print(f"  {t:6.2f} s  {role:10}  {reason:18}  streams there {streams:3}  "
              f"frontier {frontier}")  # fmt: skip
    missed = [
        d for d in sim.done if str(d.role) == "latency" and not d.met and at <= d.at <= at + 5
    ]
    print(f"latency tier, finished {at:.0f}-{at + 8:.0f} s and missed the SLO: {len(missed)}")
    for d in missed:
        print(f"  done at {d.at:6.2f} s  TTFT {d.ttft * 1e3:4.0f} ms  TPOT {d.tpot * 1e3:5.2f} ms")


if __name__ == "__main__":
    main()
