"""What a process the tests and `tiergate up` start spends before it serves, with the bytecode
compiled ahead and without it, where PYTHONDONTWRITEBYTECODE is set (so nothing is written
back and every start compiles again). Without bytecode: PYTHONPYCACHEPREFIX names a folder,
where Python then looks for the compiled files, holding only the standard library's (as a
Python installation ships them): the environment's packages and the project's are not there.

Per round, in rotated order, the wall and CPU seconds of a child process that imports what
`tiergate serve` imports (the gateway's app and the command) and of one that imports what
`tiergate sim` imports; prints the per-round values, the medians and their ratio.

    .venv/bin/python docs/results/bytecode/starts.py [ROUNDS]"""

import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WHAT = {
    "serve": "import gateway.serve.app, tiergate.cli",
    "sim": "import tiergate.cli, engines.sim.server",
}
ARMS = ("compiled", "source")


def start(code: str, arm: str, empty: str) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child importing `code`."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if arm == "source":
        env["PYTHONPYCACHEPREFIX"] = empty
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-P", "-c", code], env=env, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as empty:
        env = {**os.environ, "PYTHONPYCACHEPREFIX": empty}
        stdlib = sysconfig.get_paths()["stdlib"]
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-x", "site-packages", stdlib],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)  # fmt: skip
        for r in range(rounds):
            order = ARMS if r % 2 == 0 else ARMS[::-1]
            for what, code in WHAT.items():
                for arm in order:
                    wall, cpu = start(code, arm, empty)
                    got.setdefault((what, arm), []).append((wall, cpu))
                    print(f"round {r + 1} {what:5} {arm:8} wall {wall:.3f} s  cpu {cpu:.3f} s")
    print(f"\nmedians over {rounds} rounds (n = {rounds} starts each)")
    for what in WHAT:
        med = {a: [statistics.median(x[i] for x in got[(what, a)]) for i in (0, 1)]
               for a in ARMS}  # fmt: skip
        for arm in ARMS:
            print(f"{what:5} {arm:8} wall {med[arm][0]:.3f} s  cpu {med[arm][1]:.3f} s")
        c, s = med["compiled"], med["source"]
        print(f"{what:5} compiled / source: wall {c[0] / s[0]:.3f}x  cpu {c[1] / s[1]:.3f}x")


if __name__ == "__main__":
    main()
