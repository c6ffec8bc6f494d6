"""Each backend's learned TPOT curve at the end of one routing-sim run with conversations,
against its decode step alone (the profile's closed-loop truth, one-off prompts), and the
prefill cost per prompt token the model learned (where the code has one).

    python docs/results/routing-sim-prefill/curves.py [SEED] [DEPLOYMENT,SHAPE,SLO]

Run from the root of the tree whose gateway it measures (PYTHONPATH=that root for another
commit's). Prints one line per backend and where the streams went.
"""

from __future__ import annotations

import statistics
import sys

from loadtests.routing_sim import cosim
from loadtests.routing_sim.study import Arm, spec_of, true_tpot

SHOWN = (1, 8, 16, 24, 32, 48)


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    deployment, shape, slo = (sys.argv[2] if len(sys.argv) > 2 else "a-lot,burst,standard").split(
        ","
    )
    spec = spec_of((deployment, shape, slo), Arm("learned", "learned"), seed, 20.0, "chat")
    sim = cosim._Sim(spec)
    sim.run()
    print(f"{deployment} {shape} {slo}, seed {seed}, chat: TPOT ms at {SHOWN} streams")
    for e in sim.engines:
        url, profile = e.entry.url, e.profile.name
        model = sim.learner.models[url]
        cost = getattr(getattr(model, "prefill", None), "per_token", None)
        learned = [round(sim.registry.curves[url].tpot.at(n) * 1e3, 2) for n in SHOWN]
        truth = [round(true_tpot(profile, n) * 1e3, 2) for n in SHOWN]
        said = "-" if cost is None else f"{cost * 1e6:.1f} ms"
        print(
            f"  {url} ({profile}): learned {learned}; decode alone {truth}; "
            f"prefill per 1,000 prompt tokens learned: {said} "
            f"(profile: {e.profile.cost.prefill_per_token_s * 1e6:.1f} ms)"
        )
    for role in sorted({d.role for d in sim.done}):
        tpots = sorted(d.tpot for d in sim.done if d.role == role and d.tpot)
        print(
            f"  streams on {role}: {len(tpots)}, TPOT median {statistics.median(tpots) * 1e3:.2f}"
            f" ms, p90 {tpots[int(0.9 * len(tpots))] * 1e3:.2f} ms, SLO met "
            f"{sum(d.met for d in sim.done if d.role == role)}"
        )


if __name__ == "__main__":
    main()
