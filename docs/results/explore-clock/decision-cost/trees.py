"""The learned policy's decisions in two checkouts, both with their routing modules compiled:
`tiergate bench decision-cost --policy learned --runs 1 --replays 1` in a fresh process per
checkout and round, run from that checkout (`PYTHONPATH` at it), the order alternating, the
environment padded by a different length each round (the same for both). Prints each round's
p50 and p99 per scene and size, the medians and the ratios (AFTER / BEFORE); writes every value
to OUT.json. The rounds and the report are ../../decision-cost-compiled/ab.py's.

    python trees.py ROUNDS CALLS BEFORE AFTER OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "decision-cost-compiled"))
from ab import SCENES, SIZES, Cells, alternate, report


def one(tree: str, r: int, calls: int) -> Cells:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TIERGATE_COMPILED": "1", "PYTHONPATH": tree,
               "PAD": "x" * (r * 1037 % 4096)}  # fmt: skip
        cmd = [sys.executable, "-m", "tiergate", "bench", "decision-cost", "--policy", "learned",
               "--runs", "1", "--replays", "1", "--calls", str(calls), "--out", tmp]
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tree)
        data = json.loads((Path(tmp) / "decision-cost.json").read_text())
    run = data["runs"][0]
    return {f"{s}/{n}": run[s]["policies"]["learned"][n] for s in SCENES for n in SIZES}


def main(rounds: int, calls: int, trees: dict[str, str], out: str) -> None:
    rows = alternate(rounds, list(trees), lambda arm, r: one(trees[arm], r, calls), out)
    report(rows, list(trees), "after", "before")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), {"before": sys.argv[3], "after": sys.argv[4]},
         sys.argv[5])  # fmt: skip
