"""Where the cycle collector runs in `bench decision-cost`'s `moving` scene: in a decision, in
the step after it (a stream ends, the request's starts) or in a step that refits the
predictions (`loadtests.decision_cost.Moving`), the learned policy with SIZE backends over
20,000 decisions after `gc.freeze()`, as the bench runs them.

Usage (from the repository root):

    python docs/results/decision-cost-3677883/where_collections.py SIZE"""

import gc
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing import PolicyParams, RouteRequest, RouterState, Slo, build_policy
from loadtests import decision_cost as dc

size = int(sys.argv[1])
policy = build_policy("learned", PolicyParams())
gc.collect()
gc.freeze()
where: Counter[str] = Counter()
phase = ["start"]
gc.callbacks.append(lambda ph, info: ph == "start" and where.update([phase[0]]))
snap = dc.snapshot(size)
req = RouteRequest(dc._MODEL, stream=True, slo=Slo())
tight = RouteRequest(dc._MODEL, stream=True, slo=Slo(tpot_s=0.012))
rng, state = random.Random(0), RouterState()
dc._forget(snap, limits=True)
moving, now = dc.Moving(snap, 0), snap
for _ in range(20_000):
    r = tight if moving.tight() else req
    phase[0] = "decision"
    decision = policy(r, now, state, rng)
    state = decision.state
    phase[0] = "refit step" if (moving.steps + 1) % moving.refit_every == 0 else "step"
    now = moving.step(decision.candidates[0].url, r.slo.tpot_s)
print(f"{size} backends, collections by where they ran: {dict(where)}")
