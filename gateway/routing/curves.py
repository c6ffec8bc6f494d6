"""What the latency model predicts for one backend, as routing reads it: immutable values.

A `Curve` is a non-decreasing function of concurrency (the streams on the backend): a value per
integer concurrency up to TABLE_MAX (piecewise linear between fixed knots unless the model
tabulates it itself), straight past it. A `Prediction` holds a backend's TPOT and TTFT curves,
the load up to which they rest on observations (the frontier), the spread of requests around the
TPOT curve, and what the model knows about its speculative decoding. The learning that produces
them lives in gateway.backends.latency_model; routing only reads them, so a decision stays a pure
function of its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.routing.frozen import rebuilt

__all__ = ["KNOTS", "TABLE_MAX", "UNKNOWN_CURVE", "Curve", "Prediction"]

# Concurrencies the model keeps a value for: dense where engines change fast (small batches,
# the knee of a speculative batch), sparse past it. Every two streams from 6 to 16: a knee
# between 12 and 16 (an A100-class EAGLE verifying 6 tokens a stream turns compute-bound at
# ~14) was drawn as a straight line to 16, flat enough that the policy overshot it
# (docs/results/routing-sim-knots/).
KNOTS: Final[tuple[int, ...]] = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 40, 48, 64, 80,
                                 96, 128, 192, 256)  # fmt: skip
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
    # The value at each integer concurrency 0..TABLE_MAX, for reading without a call; given,
    # or drawn between the knots' values.
    table: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.values) != len(KNOTS):
            raise ValueError(f"a curve needs {len(KNOTS)} values, got {len(self.values)}")
        if not self.evidence:
            object.__setattr__(self, "evidence", (0.0,) * len(KNOTS))
        if not self.table:
            object.__setattr__(self, "table", _tabulate(self.values))
        elif len(self.table) != TABLE_MAX + 1:
            raise ValueError(f"a curve's table needs {TABLE_MAX + 1} values")

    @classmethod
    def tabled(cls, table: Sequence[float], evidence: Sequence[float] = ()) -> Curve:
        """A curve given by its value at every integer concurrency 0..TABLE_MAX (its knots'
        values read from it; past TABLE_MAX, straight on from the last two knots)."""
        return cls(tuple(table[k] for k in KNOTS), tuple(evidence), tuple(table))

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
                best, dist = e, float(abs(k - n))  # (a float throughout, as compiled)
        return best

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return rebuilt(self)


UNKNOWN_CURVE: Final = Curve((0.0,) * len(KNOTS))


@dataclass(frozen=True, slots=True)
class Prediction:
    """One backend's predicted latency as a function of its concurrency.

    Up to `frontier` streams the TPOT curve rests on observations; past it the model's guess,
    unsure by `doubt` (gateway.backends.latency_model). A request's own TPOT scatters around the
    curve: ln(TPOT) is taken as normal with mean ln(curve) + `bias` and deviation `spread`, as
    observed. `frontier` 0: nothing observed yet (the curves are zeros and mean nothing). A
    curve built by hand is taken as observed everywhere."""

    tpot: Curve  # seconds per output token with n streams running
    ttft: Curve  # seconds to the first token of a request that makes it n streams
    tokens_per_step: float = 1.0  # 1 + accepted drafts per verification step (1: plain decoding)
    acceptance: float | None = None  # accepted / proposed draft tokens, lately
    observed_at: float | None = None  # the last observation, on the snapshot's clock
    frontier: int = TABLE_MAX  # the most streams observed there (0: none yet)
    spread: float = 0.1  # deviation of ln(a request's TPOT) around ln(curve) + bias
    bias: float = 0.0  # mean of ln(a request's TPOT / curve), lately
    # Per concurrency 0..TABLE_MAX, the deviation of ln(curve) itself where the model is unsure
    # (past the frontier); () : none anywhere.
    doubt: tuple[float, ...] = field(default=(), repr=False)
    # Seconds a prompt token adds to a request's prefill there (0: not learned).
    prefill_s: float = 0.0
    # Per concurrency 0..TABLE_MAX, -(ln TPOT + bias) (inf where TPOT is 0) and 1 / (sqrt(2) x
    # the whole deviation of ln(a request's TPOT)): a stream meets an SLO s there with the
    # probability (1 + erf((ln s + offset) x z_scale)) / 2, the two read once per candidate.
    offset: tuple[float, ...] = field(init=False, repr=False, compare=False)
    z_scale: tuple[float, ...] = field(init=False, repr=False, compare=False)
    # Per concurrency 0..TABLE_MAX, (TPOT, TTFT, offset, z_scale) there: what a decision reads
    # per candidate at n and n + 1 streams, in two reads instead of eight.
    rows: tuple[tuple[float, float, float, float], ...] = field(
        init=False, repr=False, compare=False
    )
    # gateway.routing.learned.most_streams per ln SLO, as computed: a search the same for every
    # decision until the model learns again (a cache of a function of the fields above).
    limits: dict[float, int] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # gateway.routing.learned.peak per ln SLO, as computed (the same kind of cache).
    peaks: dict[float, tuple[float, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # gateway.routing.learned.outlook per (streams there, their SLOs, the request's SLO and the
    # policy's limits), as computed: between two decisions most candidates' loads are as they
    # were, and the outlook is a function of these and of the fields above (a cache).
    outlooks: dict[tuple[Any, ...], tuple[float, float, float, float, bool, int, bool]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "offset", tuple(
            -math.log(v) - self.bias if v > 0 else math.inf for v in self.tpot.table))
        s2 = self.spread * self.spread
        scale = 1.0 / (math.sqrt(2.0 * s2) or 1e-12)
        z = (tuple(1.0 / math.sqrt(2.0 * (s2 + d * d) or 1e-24) for d in self.doubt)
             if self.doubt else (scale,) * (TABLE_MAX + 1))  # fmt: skip
        object.__setattr__(self, "z_scale", z)
        object.__setattr__(
            self, "rows", tuple(zip(self.tpot.table, self.ttft.table, self.offset, z, strict=True))
        )

    @property
    def known(self) -> bool:
        return self.frontier > 0

    def __reduce__(self) -> tuple[type[Any], tuple[Any, ...]]:
        return rebuilt(self)
