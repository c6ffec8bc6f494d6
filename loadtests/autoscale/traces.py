"""The autoscaling study's traffic: open-loop arrivals whose rate and mix follow a trace.

Rates are in units of one pool replica's measured ceiling (its completions per second when it is
saturated with the trace's usual request, measured per deployment before the study), so that
one trace means the same pressure on any hardware. Three traces:

- `diurnal`: a day's cycle, compressed (its length is a parameter), from a trough of 1 ceiling
  to a peak of 5 and back (a raised cosine);
- `flash`: a steady 1.2 ceilings, then five times as much within one minute, held a quarter
  of the trace (ten minutes of the 40), and back within a minute;
- `shift`: a steady rate whose answers turn four times as long halfway, while the speculative
  engines' acceptance drops (chat turning into long generation on another domain).

Each request draws its SLO class from the mix and its answer length uniformly within +/- 50% of
its class's mean. Arrivals are a Poisson process of the traced rate, drawn by thinning; the
seed fixes them, so every arm of one seed meets the same requests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["SPREAD", "TRACES", "Arrival", "Klass", "Trace", "arrivals"]

# An answer's length: its class's mean, +/- this share, uniformly.
SPREAD: Final = 0.5

# The flash crowd's shape: steady for a quarter of the trace, then x5 within a minute (or a
# fortieth of the trace, if shorter), held a quarter of the trace, and back as fast.
FLASH_AT: Final = 0.25
FLASH_HOLD: Final = 0.25
FLASH_RAMP_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Klass:
    """An SLO class: its bounds, its share of the requests and its answers' mean length (before
    and after a `shift`)."""

    name: str
    ttft_s: float
    tpot_s: float
    share: float
    output_tokens: int
    shifted_output_tokens: int


@dataclass(frozen=True, slots=True)
class Trace:
    kind: Literal["diurnal", "flash", "shift"]
    duration_s: float
    about: str

    @property
    def shift_at(self) -> float | None:
        """When the workload shifts (`shift` only): halfway."""
        return self.duration_s / 2 if self.kind == "shift" else None

    def rate(self, t: float) -> float:
        """Requests per second at `t`, in pool-replica ceilings."""
        if self.kind == "diurnal":
            return 1.0 + 4.0 * (1.0 - math.cos(2.0 * math.pi * t / self.duration_s)) / 2.0
        if self.kind == "flash":
            start, ramp, end = self.flash
            up = min(1.0, max(0.0, (t - start) / ramp))
            down = min(1.0, max(0.0, (t - end + ramp) / ramp))
            return 1.2 * (1.0 + 4.0 * (up - down))
        return 2.0

    @property
    def flash(self) -> tuple[float, float, float]:
        """The flash crowd's start, ramp and end (its last ramp done), in seconds."""
        d = self.duration_s
        ramp = min(FLASH_RAMP_S, d / 40)
        start = FLASH_AT * d
        return start, ramp, start + 2 * ramp + FLASH_HOLD * d

    @property
    def peak(self) -> float:
        return {"diurnal": 5.0, "flash": 6.0, "shift": 2.0}[self.kind]


TRACES: Final = {
    "diurnal": Trace("diurnal", 7200.0, "a day's cycle compressed into 2 h: 1 -> 5 -> 1 ceilings"),
    "flash": Trace("flash", 2400.0, "1.2 ceilings, then x5 within a minute for ten minutes"),
    "shift": Trace("shift", 2400.0,
                   "2 ceilings; halfway, answers 4x as long and the EAGLE acceptance drops"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    klass: int  # index into the classes
    output_tokens: int


def arrivals(
    trace: Trace, classes: tuple[Klass, ...], ceiling: float, seed: int
) -> Iterator[Arrival]:
    """The requests of one run, in time order: a Poisson process of rate `trace.rate(t) x
    ceiling`, thinned from one of the trace's peak rate (Lewis and Shedler)."""
    rng = random.Random(seed)
    top = trace.peak * ceiling
    shares = [c.share for c in classes]
    shift = trace.shift_at
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= trace.duration_s:
            return
        if rng.random() * top > trace.rate(t) * ceiling:
            continue
        k = rng.choices(range(len(classes)), shares)[0]
        c = classes[k]
        mean = c.shifted_output_tokens if shift is not None and t >= shift else c.output_tokens
        spread = int(mean * SPREAD)
        yield Arrival(t, k, rng.randint(max(1, mean - spread), mean + spread))
