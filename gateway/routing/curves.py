"""What the latency model predicts for one backend, as routing reads it: immutable values.

A `Curve` is a non-decreasing function of concurrency (the streams on the backend), piecewise
linear between fixed knots and straight past the last one. A `Prediction` holds a backend's TPOT
and TTFT curves with what the model knows about its speculative decoding. The learning that
produces them lives in gateway.latency_model; routing only reads them, so a decision stays a
pure function of its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = ["KNOTS", "TABLE_MAX", "Curve", "Prediction"]

# Concurrencies the model keeps a value for: dense where engines change fast (small batches,
# the knee of a speculative batch), sparse past it.
KNOTS: Final[tuple[int, ...]] = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128,
                                 192, 256)  # fmt: skip
# Integer concurrencies up to here are tabulated when a curve is built: a decision reads a
# value per candidate, so a lookup must not interpolate.
TABLE_MAX: Final = KNOTS[-1]


def _interpolate(values: Sequence[float], n: float) -> float:
    """The piecewise-linear function through (KNOTS[i], values[i]), straight past both ends."""
    k = KNOTS
    if n <= k[0]:
        i = 0
    elif n >= k[-1]:
        i = len(k) - 2
    else:
        i = 0
        while k[i + 1] < n:
            i += 1
    x0, x1 = k[i], k[i + 1]
    y0, y1 = values[i], values[i + 1]
    y = y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    return y if n >= k[0] else y0  # below one stream: as for one


def _tabulate(values: Sequence[float]) -> tuple[float, ...]:
    """The values at 0..TABLE_MAX, a segment at a time (the learner rebuilds curves on every
    monitor round: per point interpolation took ~0.3 ms a curve, this ~0.02 ms)."""
    table = [values[0], values[0]]  # 0 and 1 streams: as for one
    for i in range(len(KNOTS) - 1):
        x0, x1, y0 = KNOTS[i], KNOTS[i + 1], values[i]
        slope = (values[i + 1] - y0) / (x1 - x0)
        table.extend(y0 + slope * (x - x0) for x in range(x0 + 1, x1 + 1))
    return tuple(table)


@dataclass(frozen=True, slots=True)
class Curve:
    """Values (seconds) at KNOTS, with the evidence (observations, decayed) behind each."""

    values: tuple[float, ...]
    evidence: tuple[float, ...] = ()
    # The value at each integer concurrency 0..TABLE_MAX, for reading without a call.
    table: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.values) != len(KNOTS):
            raise ValueError(f"a curve needs {len(KNOTS)} values, got {len(self.values)}")
        if not self.evidence:
            object.__setattr__(self, "evidence", (0.0,) * len(KNOTS))
        object.__setattr__(self, "table", _tabulate(self.values))

    @classmethod
    def of(cls, fn: Callable[[int], float], evidence: float = 0.0) -> Curve:
        """A curve through ``fn(knot)`` at every knot."""
        return cls(tuple(float(fn(k)) for k in KNOTS), (evidence,) * len(KNOTS))

    def at(self, n: int) -> float:
        if 0 <= n <= TABLE_MAX:
            return self.table[n]
        return _interpolate(self.values, n)

    def evidence_at(self, n: int) -> float:
        """The evidence of the knot nearest ``n`` (how sure the value there is)."""
        best, dist = 0.0, math.inf
        for k, e in zip(KNOTS, self.evidence, strict=True):
            if abs(k - n) < dist:
                best, dist = e, abs(k - n)
        return best


@dataclass(frozen=True, slots=True)
class Prediction:
    """One backend's predicted latency as a function of its concurrency."""

    tpot: Curve  # seconds per output token with n streams running
    ttft: Curve  # seconds to the first token of a request that makes it n streams
    tokens_per_step: float = 1.0  # 1 + accepted drafts per verification step (1: plain decoding)
    acceptance: float | None = None  # accepted / proposed draft tokens, lately
    observed_at: float | None = None  # the last observation, on the snapshot's clock
