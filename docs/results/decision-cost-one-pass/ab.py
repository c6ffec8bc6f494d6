"""Decisions of the learned policy in the decision-cost bench's `moving` scene (5 rounds of
4,000 timed decisions, timed once, after gc.freeze()), with 3 and 16 backends, for two trees
of the code: `two-passes` (a pass over each tighter class's whole streams before their shares,
as up to 20b02f5) and `one-pass` (shares only). Each arm runs in its own process, the order
alternating, 8 rounds. The process's environment is padded by a different length in each round
(the same for both arms): the size of the environment moves where the process's stack lies,
and with it such timings by several percent, one way for one code and another way for another.

    python ab.py OLD_TREE NEW_TREE OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json
from loadtests.decision_cost import snapshot, one_pass, _pct
from gateway.routing.params import PolicyParams
from gateway.routing.policies import build_policy
pol = build_policy("learned", PolicyParams())
res = {}
for size in (3, 16):
    snap = snapshot(size)
    gc.collect(); gc.freeze()
    out = []
    for r in range(5): out += one_pass(pol, snap, "moving", r, 4000)
    gc.unfreeze(); out.sort()
    res[size] = {"samples": len(out), "p50_us": _pct(out, 50), "p99_us": _pct(out, 99)}
print(json.dumps(res))
"""


def main(old: str, new: str, out: str) -> None:
    arms = {"two-passes": old, "one-pass": new}
    rows = []
    for r in range(8):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for arm in order:
            env = {**os.environ, "PYTHONPATH": arms[arm], "PAD": "x" * (r * 1037 % 4096)}
            child = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                                   text=True, check=True)  # fmt: skip
            for size, cell in json.loads(child.stdout).items():
                rows.append({"round": r, "arm": arm, "backends": int(size), **cell})
                print(r, arm, size, cell, flush=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
