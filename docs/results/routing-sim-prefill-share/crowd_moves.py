"""`bench conversations`' two phases with the gateway's defaults, ROUNDS fresh deployments: per
round each chat's instances by turn among the 32 at once (L, A, B in the order first seen),
the later turns home, the first turns per instance and the engines' mean TPOT (ms) over the
phase. PYTHONPATH at the checkout to try.

Usage: python crowd_moves.py ROUNDS"""

import collections
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtests import conversations as c

_measure = c.measure


def measure(chats: Any) -> dict[str, Any]:
    names: dict[str, str] = {}
    if len(chats) == 32:
        seqs: collections.Counter[str] = collections.Counter()
        for ch in chats:
            seqs["".join(names.setdefault(b, "LAB?"[min(len(names), 3)]) for b in ch.backends)] += 1
        print("  seqs", dict(seqs), flush=True)
    return _measure(chats)


c.measure = measure
for r in range(int(sys.argv[1])):
    with tempfile.TemporaryDirectory() as d:
        crowd = c.one(c.DEFAULTS, c.Options(), Path(d))["crowd"]
    print(r, crowd["at_home"], crowd["later_turns"], crowd["first_turns"],
          [e["mean_tpot_ms"] for e in crowd["engines"]], flush=True)  # fmt: skip
