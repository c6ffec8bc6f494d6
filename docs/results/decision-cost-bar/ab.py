"""The decision-cost bench's three scenes (1 run, 4,000 decisions a round, 5 rounds, learned
only, timed once) with no bar, with rich's default bar (redrawn 10 times a second from a thread
of its own) and with the bar drawn only when told, in a rotating order, 3 rounds."""
import json, sys
from loadtests.decision_cost import repeated
from rich.progress import Progress
from rich.console import Console
from io import StringIO
ARMS = ("none", "rich-default", "still")
def one(arm):
    con = Console(file=StringIO(), force_terminal=True)
    if arm == "none":
        return repeated(("learned",), 1, 4000, lambda d: None, 1)
    with Progress(console=con, auto_refresh=(arm == "rich-default")) as bar:
        t = bar.add_task("x", total=3)
        return repeated(("learned",), 1, 4000, lambda d: bar.update(t, completed=d, refresh=arm == "still"), 1)
rows = []
for r in range(3):
    order = ARMS[r % 3:] + ARMS[:r % 3]
    for arm in order:
        s = one(arm)["summary"]
        for sc in s:
            for sz in ("3", "16"):
                c = s[sc]["learned"][sz]
                rows.append({"round": r, "arm": arm, "scene": sc, "backends": int(sz), "samples": c["samples"],
                             "p50_us": c["p50_us"]["median"], "p99_us": c["p99_us"]["median"]})
                print(r, arm, sc, sz, c["p50_us"]["median"], c["p99_us"]["median"], flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
