"""Each phase's requests by the tier that served them, SLO-met and TPOT p50, in one run of the
A100 `little` 12 ms cell with conversations: the learned policy or a fixed latency-tier limit.

    python docs/results/little-12ms-seeds/by_tier.py SEED {learned|LIMIT} {burst|step}"""

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.routing.params import PolicyParams
from loadtests.routing_sim.cosim import simulate
from loadtests.routing_sim.study import Arm, oracle_arm, spec_of

seed, arm, shape = int(sys.argv[1]), sys.argv[2], sys.argv[3]
a = Arm("learned", "learned", PolicyParams()) if arm == "learned" else oracle_arm(int(arm))
r = simulate(spec_of(("little", shape, "interactive"), a, seed, 20.0, "chat"))
by = collections.defaultdict(list)
for d in r.done:
    if d.phase is not None:
        by[(d.phase, d.role.value)].append(d)
print(arm, "seed", seed, shape, "SLO-met", sum(d.met for d in r.done if d.phase is not None))
for ph in sorted({k[0] for k in by}):
    row = []
    for role in ("latency", "throughput"):
        ds = by.get((ph, role), [])
        t = sorted(d.tpot for d in ds)
        row.append(f"{role} {len(ds):3d} met {sum(d.met for d in ds):3d}"
                   + (f" TPOT p50 {t[len(t) // 2] * 1e3:5.2f} ms" if t else ""))
    print(f"  phase {ph}: " + " | ".join(row))
