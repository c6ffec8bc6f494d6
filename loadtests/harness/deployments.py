"""The deployments and SLO classes the routing benchmarks run, one catalog for both: `tiergate
bench routing-sim` (on a virtual clock) and `tiergate bench routing` (simulators over HTTP).

A deployment is engine profiles by role (engines/sim/profiles): the tutorial's A100 engines
with three acceptance rates and a shift between two, and H200-like engines built from the
reference measurements of a Llama-3.1-8B step on an H200 (profiles/README.md), whose EAGLE
engine crosses the AWQ pool per token at about 32, 48, 64 or 96 streams, or never helps, with a
deployment of two EAGLE instances and one whose pool holds two unlike instances. Each runs the
SLO classes that bind somewhere on its hardware.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from engines.sim.profile import load_profile
from loadtests.harness.phases import Slo

__all__ = ["DEPLOYMENTS", "SLO_CLASSES", "Deployment"]


@dataclass(frozen=True, slots=True)
class Deployment:
    latency: tuple[str, ...]  # the latency tier's engines' profiles
    throughput: tuple[str, ...]
    slos: tuple[str, ...]  # the SLO classes its cells run (SLO_CLASSES)
    about: str  # what it stands for
    # The latency engines' acceptance becomes this profile's vector at this share of the run.
    shift: tuple[float, str] | None = None

    def shifts(self, duration: float) -> tuple[tuple[float, tuple[float, ...]], ...]:
        """(virtual second, acceptance vector) of the shift in a run of `duration` s."""
        if self.shift is None:
            return ()
        at, profile = self.shift
        spec = load_profile(profile).speculative
        assert spec is not None, f"{profile} does not speculate"
        return ((at * duration, spec.acceptance),)


SLO_CLASSES: Final = {
    "tight": Slo(1.0, 0.004),
    "interactive": Slo(1.0, 0.012),
    "standard": Slo(1.0, 0.025),
}
# The tutorial's A100 engines are slow enough per token for 12 and 25 ms to bind; an H200
# serves an 8B model at 1-7 ms per token, where 12 and 25 ms never bind (every request meets
# them: the cells measure goodput alone) and 4 ms binds from about 20-60 streams.
_A100: Final = ("interactive", "standard")
_H200: Final = ("tight", "standard")
_H200_POOL: Final = ("h200-awq", "h200-awq")
DEPLOYMENTS: Final = {
    "little": Deployment(("v4-low",), ("v3", "v3"), _A100,
                         "A100 (the tutorial's engines), EAGLE accepting little: 1.67 tokens "
                         "per step"),
    "tutorial": Deployment(("v4",), ("v3", "v3"), _A100, "A100, the tutorial's EAGLE: 3.26"),
    "a-lot": Deployment(("v4-high",), ("v3", "v3"), _A100, "A100, EAGLE accepting a lot: 5.02"),
    "shift": Deployment(("v4",), ("v3", "v3"), _A100,
                        "A100, the tutorial's EAGLE whose acceptance drops to 1.67 halfway",
                        shift=(0.5, "v4-low")),
    "knee-32": Deployment(("h200-eagle-a21",), _H200_POOL, _H200,
                          "H200-like, 2.1 tokens per step: EAGLE as fast per token as AWQ at "
                          "~32 streams"),
    "knee-48": Deployment(("h200-eagle-a27",), _H200_POOL, _H200, "H200-like, 2.7: at ~48"),
    "knee-64": Deployment(("h200-eagle-a31",), _H200_POOL, _H200, "H200-like, 3.1: at ~64"),
    "knee-96": Deployment(("h200-eagle-a40",), _H200_POOL, _H200, "H200-like, 4.0: at ~96"),
    "eagle-worse": Deployment(("h200-eagle-a13",), _H200_POOL, _H200,
                              "H200-like, 1.3: EAGLE slower per token than AWQ at every load"),
    "two-latency": Deployment(("h200-eagle-a27", "h200-eagle-a27"), _H200_POOL, _H200,
                              "H200-like, two EAGLE instances (2.7) and two AWQ"),
    "unlike-pool": Deployment(("h200-eagle-a31",), ("h200-awq", "h200-bf16"), _H200,
                              "H200-like, EAGLE (3.1) and a pool of one AWQ and one bf16 "
                              "instance"),
}  # fmt: skip
