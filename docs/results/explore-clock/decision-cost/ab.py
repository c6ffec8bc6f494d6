"""The learned policy's decisions in two checkouts, both with their routing modules compiled:
`tiergate bench decision-cost --policy learned --runs 1 --replays 1` in a fresh process per
checkout and round, run from that checkout (`PYTHONPATH` at it), the order alternating, the
environment padded by a different length each round (the same for both). Prints each round's
p50 and p99 per scene and size, the medians and the ratios (AFTER / BEFORE); writes every value
to OUT.json.

    python ab.py ROUNDS CALLS BEFORE AFTER OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCENES = ("moving", "fixed", "cold")
SIZES = ("3", "16")


def one(tree: str, r: int, calls: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TIERGATE_COMPILED": "1", "PYTHONPATH": tree,
               "PAD": "x" * (r * 1037 % 4096)}  # fmt: skip
        cmd = [sys.executable, "-m", "tiergate", "bench", "decision-cost", "--policy", "learned",
               "--runs", "1", "--replays", "1", "--calls", str(calls), "--out", tmp]
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tree)
        report = json.loads((Path(tmp) / "decision-cost.json").read_text())
    run = report["runs"][0]
    return {f"{s}/{n}": run[s]["policies"]["learned"][n] for s in SCENES for n in SIZES}


def main(rounds: int, calls: int, trees: dict[str, str], out: str) -> None:
    rows = []
    for r in range(rounds):
        for arm in list(trees) if r % 2 == 0 else list(trees)[::-1]:
            for cell, v in one(trees[arm], r, calls).items():
                rows.append({"round": r, "arm": arm, "cell": cell, **v})
            print(f"round {r + 1}/{rounds}: {arm} done", flush=True)
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")
    print("cell            arm        p50 median (rounds)                 p99 median (rounds)")
    for cell in (f"{s}/{n}" for s in SCENES for n in SIZES):
        med = {}
        for arm in trees:
            got = [x for x in rows if x["cell"] == cell and x["arm"] == arm]
            p50, p99 = [x["p50_us"] for x in got], [x["p99_us"] for x in got]
            med[arm] = statistics.median(p50), statistics.median(p99)
            each50, each99 = (" ".join(f"{v:.1f}" for v in vs) for vs in (p50, p99))
            print(f"{cell:15s} {arm:9s} {med[arm][0]:5.1f} ({each50})   {med[arm][1]:5.1f} "
                  f"({each99})  n={got[0]['samples']}")
        print(f"{cell:15s} ratio     p50 {med['after'][0] / med['before'][0]:.2f}x"
              f"   p99 {med['after'][1] / med['before'][1]:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), {"before": sys.argv[3], "after": sys.argv[4]},
         sys.argv[5])  # fmt: skip
