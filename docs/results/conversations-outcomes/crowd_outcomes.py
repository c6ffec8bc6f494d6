"""`bench conversations`' two phases with the gateway's defaults, ROUNDS fresh deployments: per
round the later turns home (solo of 24, crowd of 64), the crowd's first turns per instance (most
first) and what prefix affinity did with the requests that had a home, by the gateway's log
line (`affinity=`), both phases together. PYTHONPATH at the checkout to try.

Usage: python crowd_outcomes.py ROUNDS"""

import collections
import re
import sys
import tempfile
from pathlib import Path

from loadtests import conversations as c

total: collections.Counter[str] = collections.Counter()
for r in range(int(sys.argv[1])):
    d = Path(tempfile.mkdtemp())
    out = c.one(c.DEFAULTS, c.Options(), d)
    stays = collections.Counter(re.findall(r"affinity=(\S+)", (d / "gateway-0.log").read_text()))
    total.update(stays)
    crowd = out["crowd"]
    print(r, "solo", out["solo"]["at_home"], "crowd", crowd["at_home"], crowd["later_turns"],
          crowd["first_turns"], dict(stays), flush=True)  # fmt: skip
print("total outcomes", dict(total))
