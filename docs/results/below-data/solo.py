"""`bench conversations`' deployment and phases with the gateway's defaults (32 one-off chats at
once first, `--warm 32`), ROUNDS fresh deployments, the gateway probed (probe/): per round the
solo phase's later turns home (of 24) and, where short, the decision of each solo chat's first
turn that did not go to the latency engine, with every backend's outlook. From the repository's
root:

    TG_PROBE=1 TIERGATE_COMPILED=0 PYTHONPATH=.:docs/results/below-data/probe \\
        python docs/results/below-data/solo.py ROUNDS
"""

import re
import sys
import tempfile
from pathlib import Path

from loadtests import conversations as c

WARM = 32

for r in range(int(sys.argv[1])):
    d = Path(tempfile.mkdtemp())
    out = c.one(c.DEFAULTS, c.Options(warm=WARM), d)
    probes = [x for x in (d / "gateway-0.log").read_text().splitlines() if x.startswith("PROBE")]
    solo = probes[WARM : WARM + 36]
    # The latency engine: the first backend the probe lists (the configuration's first tier).
    latency = re.findall(r"\| (\d+) n=", solo[0])[0] if solo else None
    print(f"round {r + 1}: solo later turns home {out['solo']['at_home']} of 24", flush=True)
    for i in range(0, len(solo), 3):  # each chat's first turn (one chat at a time, 3 turns)
        if out["solo"]["at_home"] < 24 and f"-> {latency} " not in solo[i]:
            print(f"  chat {i // 3 + 1}'s first turn: {solo[i]}", flush=True)
