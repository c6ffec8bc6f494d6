"""A tiered deployment on loopback: simulator processes plus gateway processes (tests and
benchmarks)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadtests.harness.procs import GatewayProcess, SimProcess, start_all

MODEL = "meta-llama/Llama-2-7b-chat-hf"


@dataclass
class Stack:
    latency: list[SimProcess]
    throughput: list[SimProcess]
    gateways: list[GatewayProcess] = field(default_factory=list)

    @property
    def gateway(self) -> GatewayProcess:
        return self.gateways[0]

    @property
    def sims(self) -> list[SimProcess]:
        return self.latency + self.throughput

    def stop(self) -> None:
        for p in [*self.gateways, *self.sims]:
            p.stop()


def config(stack: Stack, **settings: Any) -> dict[str, Any]:
    tiers = [
        {"name": name, "role": role, "backends": [{"url": s.url, "models": [MODEL]} for s in sims]}
        for name, role, sims in (("eagle", "latency", stack.latency),
                                 ("awq", "throughput", stack.throughput))
        if sims
    ]  # fmt: skip
    base: dict[str, Any] = {
        "tiers": tiers,
        "log_level": "info",
        "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5},
    }
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def add_gateway(
    stack: Stack,
    workdir: Path,
    name: str = "gateway",
    env: dict[str, str] | None = None,
    **settings: Any,
) -> GatewayProcess:
    """Start one more gateway in front of the stack's engines, with its own settings."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(stack, **settings)))
    gw = GatewayProcess(config=path, env=env, log=workdir / f"{name}.log").start()
    stack.gateways.append(gw)
    return gw


def start_stack(
    workdir: Path,
    *,
    latency: int = 1,
    throughput: int = 2,
    speedup: float = 10.0,
    gateways: int = 1,
    env: dict[str, str] | None = None,
    latency_args: tuple[str, ...] = (),
    throughput_args: tuple[str, ...] = (),
    latency_profile: str | Sequence[str] = "v4",
    throughput_profile: str | Sequence[str] = "v3",
    **settings: Any,
) -> Stack:
    """`latency` (`throughput`) simulators of the profile, or one per profile if given several."""
    args = ["--speedup", str(speedup)]
    lat = [latency_profile] * latency if isinstance(latency_profile, str) else latency_profile
    thr = ([throughput_profile] * throughput if isinstance(throughput_profile, str)
           else throughput_profile)  # fmt: skip
    stack = Stack([SimProcess(profile=p, args=[*args, *latency_args]) for p in lat],
                  [SimProcess(profile=p, args=[*args, *throughput_args]) for p in thr])  # fmt: skip
    with contextlib.ExitStack() as guard:
        guard.callback(stack.stop)  # whatever fails, nothing is left running
        # The engines at once, the gateways after them, so that a gateway's first probes find
        # every engine up.
        start_all(guard, *stack.sims)
        for i in range(gateways):
            add_gateway(stack, workdir, f"gateway-{i}", env, **settings)
        guard.pop_all()  # started: the caller stops them
    return stack
