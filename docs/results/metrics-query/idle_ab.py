"""The CPU a gateway and its engines spend on the monitor's scrapes, idle (no requests), two
trees of the repository against each other: each tree's gateway in front of N of its own `instant`
simulators, scraped 4 times a second (the defaults), in rounds whose order alternates. From the
repository's root:

    python docs/results/metrics-query/idle_ab.py N ROUNDS NAME=TREE NAME=TREE
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path.cwd()))
from loadtests.harness.procs import GatewayProcess, SimProcess, cpu_seconds

MODEL = "meta-llama/Llama-2-7b-chat-hf"
SETTLE_S, MEASURE_S = 3.0, 15.0


def one(n: int, tree: str) -> tuple[float, float]:
    """(gateway ms/s, simulators' ms/s) over MEASURE_S."""
    env = {"PYTHONPATH": tree, "TIERGATE_COMPILED": "0"}
    work = Path(tempfile.mkdtemp())
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(SimProcess(profile="instant", env=env)) for _ in range(n)]
        backends = [{"url": s.url, "models": [MODEL]} for s in sims]
        cfg = {"tiers": [{"name": "pool", "role": "throughput", "backends": backends}],
               "log_level": "warning"}  # fmt: skip
        (work / "gw.yaml").write_text(yaml.safe_dump(cfg))
        with GatewayProcess(config=work / "gw.yaml", log=work / "gw.log", env=env) as gw:
            time.sleep(SETTLE_S)  # past its start
            pids = [s.pid for s in sims]
            g0, s0, t0 = cpu_seconds(gw.pid), sum(map(cpu_seconds, pids)), time.monotonic()
            time.sleep(MEASURE_S)
            span = time.monotonic() - t0
            g = 1000 * (cpu_seconds(gw.pid) - g0) / span
            s = 1000 * (sum(map(cpu_seconds, pids)) - s0) / span
            return g, s


def main() -> None:
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    arms = [a.split("=", 1) for a in sys.argv[3:]]
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in arms}
    for r in range(rounds):
        order = arms if r % 2 == 0 else arms[::-1]
        for name, tree in order:
            got[name].append(one(n, tree))
            print(f"round {r + 1} {name}: gateway {got[name][-1][0]:.1f} ms/s, "
                  f"simulators {got[name][-1][1]:.1f} ms/s", flush=True)
    print(f"\n{n} backends, {rounds} rounds of {MEASURE_S:.0f} s, order alternating")
    base = arms[0][0]
    for name, _ in arms:
        gs, ss = [v[0] for v in got[name]], [v[1] for v in got[name]]
        line = (f"{name}: gateway median {statistics.median(gs):.1f} ms/s (rounds "
                f"{' / '.join(f'{x:.1f}' for x in gs)}), simulators median "
                f"{statistics.median(ss):.1f} ms/s (rounds {' / '.join(f'{x:.1f}' for x in ss)})")
        if name != base:
            bg = statistics.median(v[0] for v in got[base])
            bs = statistics.median(v[1] for v in got[base])
            line += (f"; against {base}: gateway {statistics.median(gs) / bg:.3f}x, "
                     f"simulators {statistics.median(ss) / bs:.3f}x")
        print(line)


if __name__ == "__main__":
    main()
