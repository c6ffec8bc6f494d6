"""`tiergate bench conversations`' two phases with the gateway's defaults only (no affinity-off
arm), ROUNDS fresh deployments one after another: per round, the later turns of the 32 chats at
once that came back to their first turn's instance, and the first turns per instance. Run with
PYTHONPATH pointing at a checkout with a variant applied to try it.

Usage: python crowd.py ROUNDS"""

import sys
import tempfile
from pathlib import Path

from loadtests import conversations as c

for r in range(int(sys.argv[1])):
    with tempfile.TemporaryDirectory() as d:
        out = c.one(c.DEFAULTS, c.Options(), Path(d))
    crowd = out["crowd"]
    print(r, crowd["at_home"], crowd["later_turns"], crowd["first_turns"], flush=True)
