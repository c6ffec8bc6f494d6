"""The learned policy's decisions with the routing modules compiled by mypyc against the same
sources interpreted: `tiergate bench decision-cost --policy learned --runs 1 --replays 1` in a
fresh process per arm and round (`TIERGATE_COMPILED=1` / `0`), the order alternating, the
process's environment padded by a different length each round (the same for both arms: a
process's layout alone moves these timings by several percent). Prints each round's p50 and
p99 per scene and size, the medians and the ratios; writes every value to OUT.json.

    python ab.py ROUNDS CALLS OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ARMS = {"compiled": "1", "source": "0"}
SCENES = ("moving", "fixed", "cold")
SIZES = ("3", "16")
Cells = dict[str, dict[str, float]]  # per "scene/size", the bench's figures


def one(arm: str, r: int, calls: int) -> Cells:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TIERGATE_COMPILED": ARMS[arm], "PAD": "x" * (r * 1037 % 4096)}
        cmd = [sys.executable, "-m", "tiergate", "bench", "decision-cost", "--policy", "learned",
               "--runs", "1", "--replays", "1", "--calls", str(calls), "--out", tmp]
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        run = json.loads((Path(tmp) / "decision-cost.json").read_text())["runs"][0]
    return {f"{s}/{n}": run[s]["policies"]["learned"][n] for s in SCENES for n in SIZES}


def alternate(rounds: int, arms: Sequence[str], run: Callable[[str, int], Cells],
              out: str) -> list[dict[str, Any]]:  # fmt: skip
    """`run(arm, round)` for every arm in every round, the order alternating; every value
    written to `out` and returned as rows."""
    rows = []
    for r in range(rounds):
        for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
            for cell, v in run(arm, r).items():
                rows.append({"round": r, "arm": arm, "cell": cell, **v})
            print(f"round {r + 1}/{rounds}: {arm} done", flush=True)
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def report(rows: list[dict[str, Any]], arms: Sequence[str], top: str, bottom: str) -> None:
    """Each cell's p50 and p99 per arm (median and rounds), and the ratio `top` / `bottom`."""
    print("cell            arm        p50 median (rounds)                 p99 median (rounds)")
    for cell in (f"{s}/{n}" for s in SCENES for n in SIZES):
        med = {}
        for arm in arms:
            got = [x for x in rows if x["cell"] == cell and x["arm"] == arm]
            p50, p99 = [x["p50_us"] for x in got], [x["p99_us"] for x in got]
            med[arm] = statistics.median(p50), statistics.median(p99)
            each50, each99 = (" ".join(f"{v:.1f}" for v in vs) for vs in (p50, p99))
            print(f"{cell:15s} {arm:9s} {med[arm][0]:5.1f} ({each50})   {med[arm][1]:5.1f} "
                  f"({each99})  n={got[0]['samples']}")
        print(f"{cell:15s} ratio     p50 {med[top][0] / med[bottom][0]:.2f}x"
              f"   p99 {med[top][1] / med[bottom][1]:.2f}x")


def main(rounds: int, calls: int, out: str) -> None:
    rows = alternate(rounds, list(ARMS), lambda arm, r: one(arm, r, calls), out)
    report(rows, list(ARMS), "compiled", "source")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
