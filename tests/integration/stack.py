"""A tiered deployment on loopback for tests: simulator processes plus a gateway process."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engines.sim.launch import GatewayProcess, SimProcess

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
        "monitor": {"scrape_interval_s": 0.1, "probe_interval_s": 0.5, "stall_after_s": 1.0},
    }
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


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
    **settings: Any,
) -> Stack:
    args = ["--speedup", str(speedup)]
    stack = Stack([], [])
    try:
        for _ in range(latency):
            stack.latency.append(SimProcess(profile="v4", args=[*args, *latency_args]).start())
        for _ in range(throughput):
            stack.throughput.append(
                SimProcess(profile="v3", args=[*args, *throughput_args]).start()
            )
        path = workdir / "tiers.yaml"
        path.write_text(yaml.safe_dump(config(stack, **settings)))
        for i in range(gateways):
            log = workdir / f"gateway-{i}.log"
            stack.gateways.append(GatewayProcess(config=path, env=env, log=log).start())
    except BaseException:
        stack.stop()
        raise
    return stack
