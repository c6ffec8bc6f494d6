"""One run of the learned policy (or of a fixed limit), phase by phase: SLO-met requests and
each engine's mean streams (the lease integral over the phase).

    python docs/results/ridge-floor-tried/phases.py DEPLOYMENT/SHAPE/SLO SEED WORKLOAD [PARAMS]
        [LIMIT]

WORKLOAD: one-off or chat. PARAMS: policy parameters as JSON, e.g. '{"explore_rate": 0}'.
LIMIT: a fixed latency-tier limit (the study's oracle arm) instead of the learned policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, oracle_arm, spec_of


def main() -> None:
    deployment, shape, slo = sys.argv[1].split("/")
    seed, workload = int(sys.argv[2]), sys.argv[3]
    params = PolicyParams.model_validate(json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})
    arm = oracle_arm(int(sys.argv[5])) if len(sys.argv) > 5 else Arm("learned", "learned", params)
    spec = spec_of((deployment, shape, slo), arm, seed, 20.0, workload)
    r = simulate(spec)
    reasons = {str(getattr(k, "value", k)): v for k, v in r.reasons.items()}
    print("met", sum(d.met for d in r.done if d.phase is not None), reasons)
    for k, users in enumerate(spec.users):
        done = [d for d in r.done if d.phase == k]
        loads = {f"{r.profiles[u]} {u.rsplit('/', 1)[-1]}": round(v, 1)
                 for u, v in r.phase_load[k].items()}  # fmt: skip
        print(k, users, "users, n", len(done), "met", sum(d.met for d in done), "streams", loads)


if __name__ == "__main__":
    main()
