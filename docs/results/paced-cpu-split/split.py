"""User and system CPU per paced small request (64 connections, 400 requests a second, one
`instant` simulator: `bench peers`' paced cell), read apart from /proc: `tiergate serve`, vLLM's
router (from `bench peers`' own environment of the peers) and, with --python, --burn or
--taskset, a second `tiergate serve` that differs in one thing: another interpreter, a known
amount of interpreted work added to each request (burn/sitecustomize.py), or its process held
to the CPUs given (`taskset -c`); --pin-router holds every thread of vLLM's router to the CPUs
given. The targets' order alternates round by round. From the repository's root:

    python docs/results/paced-cpu-split/split.py ROUNDS [--python PATH | --burn K | --taskset CPUS]
        [--pin-router CPUS]
"""

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from rich.console import Console

sys.path.insert(0, os.getcwd())
from loadtests import peers
from loadtests.common.stats import cpu_spent, cpu_split
from loadtests.harness.procs import GatewayProcess
from loadtests.harness.proxied import Target, gateway_config, paced_small, small_body

MODEL = "meta-llama/Llama-2-7b-chat-hf"
HERE = Path(__file__).resolve().parent


class OtherPython(GatewayProcess):
    python: str = sys.executable
    cpus: str | None = None

    def command(self) -> list[str]:
        pin = [] if self.cpus is None else ["taskset", "-c", self.cpus]
        return [*pin, self.python, "-P", "-m", "tiergate", *self.argv()]


def variant(args: argparse.Namespace, sim_url: str, tmp: Path, stack: contextlib.ExitStack,
            ) -> Target | None:  # fmt: skip
    if args.python is None and args.burn is None and args.taskset is None:
        return None
    config = tmp / "variant.yaml"
    config.write_text(yaml.safe_dump(gateway_config(sim_url, MODEL)))
    if args.taskset is not None:
        gw = OtherPython(config=config, log=tmp / "variant.log")
        gw.cpus, name = args.taskset, f"tiergate on CPU {args.taskset}"
    elif args.python is not None:
        gw = OtherPython(config=config, log=tmp / "variant.log")
        ask = [args.python, "-c", "import platform; print(platform.python_version())"]
        version = subprocess.run(ask, capture_output=True, text=True, check=True).stdout.strip()
        gw.python, name = args.python, f"tiergate on Python {version}"
    else:
        env = {"PYTHONPATH": f"{HERE / 'burn'}{os.pathsep}{os.getcwd()}",
               "TIERGATE_BURN": str(args.burn)}  # fmt: skip
        gw = GatewayProcess(config=config, log=tmp / "variant.log", env=env)
        name = f"tiergate + {args.burn} loop iterations"
    stack.enter_context(gw)
    return Target(name, gw.url, lambda: [gw.pid])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", type=int)
    ap.add_argument("--python")
    ap.add_argument("--burn", type=int)
    ap.add_argument("--taskset")
    ap.add_argument("--pin-router")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    opts = peers.Options(targets=("tiergate", "vllm-router"), install=False)
    per: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        targets_up = peers.running_targets(opts, Path(tmp), MODEL, [], Console(stderr=True))
        running, versions = stack.enter_context(targets_up)
        direct = next(t for t in running if t.name == "direct")
        targets = [t for t in running if t.name != "direct"]
        if (other := variant(args, direct.url, Path(tmp), stack)) is not None:
            targets.insert(1, other)
        if args.pin_router is not None:
            for pid in next(t for t in targets if t.name == "vllm-router").server_pids():
                subprocess.run(["taskset", "-a", "-cp", args.pin_router, str(pid)], check=True,
                               stdout=subprocess.DEVNULL)  # fmt: skip
        print("versions:", versions)
        payload = json.dumps(small_body(MODEL)).encode()
        for r in range(args.rounds):
            for t in targets if r % 2 == 0 else targets[::-1]:
                pids = t.server_pids()
                before = cpu_split(pids)
                samples = asyncio.run(paced_small(f"{t.url}/v1/completions", payload, 64, 400,
                                                  args.seconds, pids))  # fmt: skip
                both, system = cpu_spent(before, cpu_split(pids))
                n = len(samples.values)
                user, system = 1000 * (both - system) / n, 1000 * system / n
                per.setdefault(t.name, []).append((user, system))
                print(f"round {r + 1} {t.name}: {n} requests, user {user:.3f} ms, "
                      f"system {system:.3f} ms a request", flush=True)  # fmt: skip
    print("median of the rounds (ms a request): user / system / both")
    for name, rows in per.items():
        print(f"  {name}: {statistics.median(u for u, _ in rows):.3f} / "
              f"{statistics.median(s for _, s in rows):.3f} / "
              f"{statistics.median(u + s for u, s in rows):.3f}")  # fmt: skip


main()
