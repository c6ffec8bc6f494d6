"""Instructions per routing decision alone, by valgrind's callgrind (exact, unlike timings).

    python count.py TREE [PYTHON]

Runs, for 3 and 16 backends, a process that makes 200 decisions to warm up, freezes the
collector and makes N more (N = 0 and 2,000) on the snapshot of `tiergate bench decision-cost`
(loadtests.decision_cost.snapshot) with a 25 ms request, under callgrind with
PYTHONHASHSEED=0; prints (count at 2,000 - count at 0) / 2,000. TREE: a checkout (its
`gateway` and `loadtests` are imported); PYTHON: an interpreter with the gateway's dependencies
(default: this one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

CALLS = 2000
CHILD = """
import gc, random, sys
from loadtests.decision_cost import snapshot
from gateway.routing import PolicyParams, RouteRequest, RouterState, Slo, build_policy
policy = build_policy("learned", PolicyParams())
req, snap = RouteRequest("m", stream=True, slo=Slo()), snapshot(int(sys.argv[1]))
rng, state = random.Random(1), RouterState()
for _ in range(200):
    policy(req, snap, state, rng)
gc.collect()
gc.freeze()
for _ in range(int(sys.argv[2])):
    policy(req, snap, state, rng)
"""


def count(tree: str, python: str, size: int, calls: int) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c", CHILD,
         str(size), str(calls)],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stderr
    found = re.search(r"Collected : (\d+)", out)
    assert found, out
    return int(found.group(1))


if __name__ == "__main__":
    tree = os.path.abspath(sys.argv[1])
    python = sys.argv[2] if len(sys.argv) > 2 else sys.executable
    for size in (3, 16):
        per = (count(tree, python, size, CALLS) - count(tree, python, size, 0)) / CALLS
        print(f"{size} backends: {per:,.0f} instructions per decision")
