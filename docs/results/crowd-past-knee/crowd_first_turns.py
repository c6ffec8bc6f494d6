"""`bench conversations`' two phases with the gateway's defaults, ROUNDS fresh deployments: per
round the later turns home (solo, crowd), the crowd's first turns per instance, the engines' mean
TPOT (ms) over the crowd, and the policy's reasons (with the tier) as the gateway's log gives
them. PYTHONPATH at the checkout to try.

Usage: python crowd_first_turns.py ROUNDS"""

import collections
import re
import sys
import tempfile
from pathlib import Path

from loadtests import conversations as c

for r in range(int(sys.argv[1])):
    d = Path(tempfile.mkdtemp())
    out = c.one(c.DEFAULTS, c.Options(), d)
    text = (d / "gateway-0.log").read_text()
    reqs = re.findall(r"reason=(\S+) tier=(\S+) backend=\S+:(\d+) status", text)
    solo, crowd = reqs[:36], reqs[36:]
    cr = out["crowd"]
    tpot = [e["mean_tpot_ms"] and round(e["mean_tpot_ms"], 1) for e in cr["engines"]]
    print(r, "solo", out["solo"]["at_home"], "crowd", cr["at_home"], cr["later_turns"],
          cr["first_turns"], tpot, flush=True)  # fmt: skip
    print("   solo reasons", collections.Counter((a, b) for a, b, _ in solo))
    print("   crowd first 40 (by finish)", collections.Counter((a, b) for a, b, _ in crowd[:40]))
    print("   workdir", d, flush=True)
