"""One seed of a routing-sim cell with the learned policy: every decision in a window of virtual
time, with what the policy saw on each backend (its streams there, its frontier, the predicted
TPOT with the request, the chance it meets its SLO, and the gain), and the chosen one.

    TIERGATE_COMPILED=0 python docs/results/routing-sim-reach/outlooks.py SEED CELL FROM_S TO_S
        [WORKLOAD]

CELL: DEPLOYMENT,SHAPE,SLO; WORKLOAD: one-off (default) or chat. Run from the root of the tree
whose gateway it measures, on the routing sources (TIERGATE_COMPILED=0: the compiled policy
cannot be wrapped to log). A line per decision:

    20.00 -> <backend> <reason> | <backend>:L|T n=.. fr=.. tp=.. p=.. g=.. | ...

(L: latency tier, T: throughput; tp in ms; g in SLO-meeting tokens per second.)
"""

from __future__ import annotations

import random
from typing import Any

from window import learned_run, window

import gateway.routing.learned as learned
from gateway.routing.types import Decision, LoadSnapshot, Role, RouteRequest, RouterState


def _short(url: str) -> str:
    return url.removeprefix("http://").removesuffix(".sim")


def main() -> None:
    seed, cell, start, end, workload = window()
    lines: list[str] = []
    decide = learned.Learned.__call__

    def logged(
        self: Any, req: RouteRequest, snap: LoadSnapshot, state: RouterState, rng: random.Random
    ) -> Decision:
        d = decide(self, req, snap, state, rng)
        if d.candidates and start <= snap.taken_at <= end:
            seen = []
            for b in sorted(snap.backends, key=lambda b: b.url):
                pred, load = snap.curves.get(b.url), snap.by_url.get(b.url)
                if load is None:
                    continue
                o = learned.outlook(b, load, pred, req.slo, self.limits)
                tier = "L" if b.role is Role.LATENCY else "T"
                fr = pred.frontier if pred else 0
                seen.append(f"{_short(b.url)}:{tier} n={o.load:2d} fr={fr:2d} "
                            f"tp={o.tpot * 1e3:5.1f} p={o.p:.2f} g={o.gain:8.1f}")  # fmt: skip
            lines.append(f"{snap.taken_at:6.2f} -> {_short(d.candidates[0].url)} {d.reason:10} | "
                         + " | ".join(seen))  # fmt: skip
        return d

    learned.Learned.__call__ = logged  # type: ignore[method-assign]
    print(f"{learned_run(seed, cell, workload)}: decisions {start}-{end} s")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
