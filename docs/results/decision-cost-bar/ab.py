"""The decision-cost bench's three scenes (1 run, 4,000 decisions a round, 5 rounds, learned
only, timed once) with no bar, with rich's default bar (redrawn 10 times a second from a thread
of its own) and with the bar drawn only when told, in a rotating order, 3 rounds.

    python ab.py OUT.json
"""

from __future__ import annotations

import json
import sys
from io import StringIO
from typing import Any

from rich.console import Console
from rich.progress import Progress

from loadtests.decision_cost import repeated

ARMS = ("none", "rich-default", "still")


def one(arm: str) -> dict[str, Any]:
    if arm == "none":
        return repeated(("learned",), 1, 4000, lambda done: None, 1)
    console = Console(file=StringIO(), force_terminal=True)
    with Progress(console=console, auto_refresh=arm == "rich-default") as bar:
        task = bar.add_task("timing", total=3)
        return repeated(
            ("learned",), 1, 4000,
            lambda done: bar.update(task, completed=done, refresh=arm == "still"), 1,
        )  # fmt: skip


def main(out: str) -> None:
    rows = []
    for r in range(3):
        for arm in ARMS[r % 3 :] + ARMS[: r % 3]:
            summary = one(arm)["summary"]
            for scene, by_policy in summary.items():
                for size in ("3", "16"):
                    cell = by_policy["learned"][size]
                    row = {"round": r, "arm": arm, "scene": scene, "backends": int(size),
                           "samples": cell["samples"], "p50_us": cell["p50_us"]["median"],
                           "p99_us": cell["p99_us"]["median"]}  # fmt: skip
                    rows.append(row)
                    print(r, arm, scene, size, row["p50_us"], row["p99_us"], flush=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
