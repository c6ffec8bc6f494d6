"""As crowd_first_turns.py, with the affinity stage's reading of each later turn whose home and
the policy's choice differ (why.diff, applied to the checkout on PYTHONPATH, writes it to the
gateway's log): printed for the rounds where a later turn left its home.

Usage: python crowd_why.py ROUNDS"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtests import conversations as c

for r in range(int(sys.argv[1])):
    d = Path(tempfile.mkdtemp())
    out = c.one(c.DEFAULTS, c.Options(), d)
    cr = out["crowd"]
    tpot = [e["mean_tpot_ms"] and round(e["mean_tpot_ms"], 1) for e in cr["engines"]]
    print(r, "solo", out["solo"]["at_home"], "crowd", cr["at_home"], cr["later_turns"],
          cr["first_turns"], tpot, flush=True)  # fmt: skip
    if cr["at_home"] < cr["later_turns"] or out["solo"]["at_home"] < out["solo"]["later_turns"]:
        log = str(d / "gateway-0.log")
        found = subprocess.run(["grep", "-B1", "MOVED", log], capture_output=True, text=True)
        print(re.sub(r"\n--\n", "\n", found.stdout)[-6000:], flush=True)
