"""The latency model: each backend's TPOT and TTFT as functions of its concurrency, learned
online from what the gateway sees, starting from a prior.

Per backend and quantity, a value per knot of concurrency (gateway.routing.curves.KNOTS). An
observation at concurrency c moves the two knots around c by its residual, split by distance,
with a step size that shrinks to 1/`memory` (an exponentially weighted mean over that many
observations per knot): a knot visited often follows change within a few seconds; one that is
not keeps what it learned. The
published curve is the weighted isotonic (non-decreasing) fit of the knots, so a few noisy
observations cannot make more load look faster; past the highest knot with data it extrapolates
the prior's shape scaled to the data (so a tier known to be fast at 16 streams is expected to
degrade from there as the prior says, not to stay flat).

Speculative decoding is modelled apart, because it is what moves fastest: TPOT = step time /
tokens per step, and the tokens per step (1 + accepted drafts per verification) come from the
engine's counters, averaged with a half-life of seconds. When that average moves, every knot of
the TPOT curve is rescaled by the ratio (the step time is the hardware's, the acceptance is the
workload's), so a workload shift moves the whole curve at once, not one visited knot at a time.

No clock, no I/O: times come in with the observations (gateway.learner feeds it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.routing import PolicyParams, Role, Slo
from gateway.routing.curves import KNOTS, Curve, Prediction

__all__ = [
    "AcceptanceRate",
    "BackendModel",
    "CurveLearner",
    "EngineSample",
    "isotonic",
    "prior_prediction",
]


def isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, max(w, 1e-9), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks[-1]
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    out: list[float] = []
    for mean, _w, count in blocks:
        out.extend([mean] * int(count))
    return out


class CurveLearner:
    """The knots of one curve: value, weight (prior plus data, capped at `memory`) and how many
    observations lie behind each."""

    __slots__ = ("memory", "seen", "shape", "values", "weights")

    def __init__(self, prior: Curve, prior_weight: float, memory: float) -> None:
        # The prior's monotone shape, kept apart from the learned values: the curve past the
        # data follows it.
        self.shape = isotonic(list(prior.values), [1.0] * len(KNOTS))
        self.values = list(prior.values)
        self.weights = [prior_weight] * len(KNOTS)
        self.seen = [0.0] * len(KNOTS)
        self.memory = memory

    def observe(self, n: float, y: float, weight: float = 1.0) -> None:
        """One observation `y` at concurrency `n`. The residual against the current line
        through the two knots around `n` moves both, each by its share of `weight` (a
        gradient step of piecewise-linear least squares: unbiased on a straight segment,
        where averaging `y` into the knots would drag each toward its neighbour)."""
        if not (math.isfinite(y) and y >= 0 and math.isfinite(n)):
            return
        k = KNOTS
        if n <= k[0]:
            self._add(0, y - self.values[0], weight)
            return
        if n >= k[-1]:
            self._add(len(k) - 1, y - self.values[-1], weight)
            return
        i = 0
        while k[i + 1] < n:
            i += 1
        f = (n - k[i]) / (k[i + 1] - k[i])
        residual = y - (self.values[i] + f * (self.values[i + 1] - self.values[i]))
        self._add(i, residual, weight * (1 - f))
        self._add(i + 1, residual, weight * f)

    def _add(self, i: int, residual: float, w: float) -> None:
        if w <= 0:
            return
        self.weights[i] = min(self.weights[i] + w, self.memory)
        self.values[i] += (w / self.weights[i]) * residual
        self.seen[i] = min(self.seen[i] + w, self.memory)

    def scale(self, factor: float) -> None:
        if factor > 0 and math.isfinite(factor):
            self.values = [v * factor for v in self.values]
            self.shape = [v * factor for v in self.shape]

    def curve(self) -> Curve:
        """The published curve: the isotonic fit of the knots with data; between them, straight
        lines; below them, the prior (no higher than the data); above them, the prior scaled
        to meet the highest."""
        prior = isotonic(self.values, self.weights)
        data = [i for i, s in enumerate(self.seen) if s >= 0.5]
        if not data:
            return Curve(tuple(prior), tuple(self.seen))
        fitted, shape = list(prior), self.shape
        dv = isotonic([self.values[i] for i in data], [self.weights[i] for i in data])
        for i, v in zip(data, dv, strict=True):
            fitted[i] = v
        first, last = data[0], data[-1]
        for i in range(first):
            fitted[i] = min(prior[i], dv[0])
        for (a, va), (b, vb) in zip(zip(data, dv, strict=True), zip(data[1:], dv[1:], strict=True),
                                    strict=False):  # fmt: skip
            for i in range(a + 1, b):
                fitted[i] = va + (vb - va) * (KNOTS[i] - KNOTS[a]) / (KNOTS[b] - KNOTS[a])
        # Past the data: the prior's shape, scaled to meet the highest learned knot. (Carrying
        # the learned slope on looked cheaper to explore with, but a flat start of the curve
        # then promised a flat curve: a burst of arrivals all went where nothing was known.)
        top = dv[-1]
        ratio = top / shape[last] if shape[last] > 0 else 1.0
        for i in range(last + 1, len(KNOTS)):
            fitted[i] = max(top, shape[i] * ratio)
        return Curve(tuple(fitted), tuple(self.seen))


class AcceptanceRate:
    """Speculative decoding's recent acceptance, from the engine's cumulative counters.

    Each scrape's increments are added to sums that halve every `halflife_s`, so the rates
    follow a workload shift within a few half-lives; a counter that went down (an engine
    restart) starts the count again.
    """

    __slots__ = ("accepted", "draft_tokens", "drafts", "halflife_s", "last", "last_at")

    def __init__(self, halflife_s: float) -> None:
        self.halflife_s = halflife_s
        self.drafts = self.draft_tokens = self.accepted = 0.0
        self.last: tuple[float, float, float] | None = None
        self.last_at = 0.0

    def observe(self, totals: tuple[float, float, float], now: float) -> None:
        """`totals`: the counters (drafts, draft tokens, accepted tokens) as scraped at `now`."""
        last, self.last = self.last, totals
        if last is None or any(t < p for t, p in zip(totals, last, strict=True)):
            self.last_at = now
            return
        decay = 0.5 ** (max(0.0, now - self.last_at) / self.halflife_s)
        self.last_at = now
        self.drafts = self.drafts * decay + (totals[0] - last[0])
        self.draft_tokens = self.draft_tokens * decay + (totals[1] - last[1])
        self.accepted = self.accepted * decay + (totals[2] - last[2])

    @property
    def tokens_per_step(self) -> float | None:
        """1 + accepted drafts per verification step; None before any draft was seen."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 1e-9 else None

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 1e-9 else None


@dataclass(frozen=True, slots=True)
class EngineSample:
    """What one scrape of an engine says, summed over its models."""

    running: float
    itl_sum: float | None = None  # inter-token latency histogram: one sample per engine step
    itl_count: float | None = None
    spec: tuple[float, float, float] | None = None  # drafts, draft tokens, accepted tokens


class BackendModel:
    """One backend's learners: TPOT and TTFT curves and the speculative acceptance."""

    def __init__(
        self, prior: Prediction, prior_weight: float, memory: float, halflife_s: float
    ) -> None:
        self.tpot = CurveLearner(prior.tpot, prior_weight, memory)
        self.ttft = CurveLearner(prior.ttft, prior_weight, memory)
        self.acceptance = AcceptanceRate(halflife_s)
        self.tps: float | None = None  # the tokens per step the TPOT curve is scaled to
        self.observed_at: float | None = None
        self._last: EngineSample | None = None

    def observe_engine(self, sample: EngineSample, now: float) -> None:
        """One scrape: acceptance first (it rescales the curve), then the step time it saw."""
        last, self._last = self._last, sample
        if sample.spec is not None:
            self.acceptance.observe(sample.spec, now)
            tps = self.acceptance.tokens_per_step
            if tps is not None:
                if self.tps is not None:
                    self.tpot.scale(self.tps / tps)
                self.tps = tps
        if last is None or sample.itl_sum is None or sample.itl_count is None:
            return
        if last.itl_sum is None or last.itl_count is None:
            return
        steps = sample.itl_count - last.itl_count
        if steps < 1 or sample.running + last.running <= 0:
            return  # idle, or a restarted engine: nothing to learn from this interval
        step_s = (sample.itl_sum - last.itl_sum) / steps
        # vLLM observes one inter-token latency per request per engine step, however many
        # tokens the step gave it: with speculation that is the step time, not the TPOT.
        self.tpot.observe((sample.running + last.running) / 2, step_s / (self.tps or 1.0))
        self.observed_at = now

    def observe_request(self, at: float, tpot: tuple[float, float] | None,
                        ttft: tuple[float, float] | None) -> None:  # fmt: skip
        """One finished stream seen at the gateway: (concurrency, TPOT) over its decode, and
        (concurrency it joined, TTFT)."""
        if tpot is not None:
            self.tpot.observe(*tpot)
        if ttft is not None:
            self.ttft.observe(*ttft)
        self.observed_at = at

    def prediction(self) -> Prediction:
        return Prediction(
            tpot=self.tpot.curve(),
            ttft=self.ttft.curve(),
            tokens_per_step=self.tps or 1.0,
            acceptance=self.acceptance.rate,
            observed_at=self.observed_at,
        )


def prior_prediction(role: Role, params: PolicyParams, slo: Slo) -> Prediction:
    """What the configured limits say before any data, in units of the default SLO: the
    latency tier beats the throughput tier up to `latency_max_concurrency` and meets the SLO up
    to `latency_hard_cap`; the throughput tier meets it comfortably to 64 streams."""
    t = slo.tpot_s
    cap, hard = params.latency_max_concurrency, params.latency_hard_cap

    def latency(n: int) -> float:
        below = 0.3 + 0.3 * min(n, cap) / cap
        past = 0.4 * max(0, n - cap) / max(1, hard - cap)
        return t * (below + past)

    def throughput(n: int) -> float:
        return t * (0.6 + 0.4 * max(0, n - 64) / 64)

    tpot = Curve.of(latency if role is Role.LATENCY else throughput)
    return Prediction(tpot=tpot, ttft=Curve.of(lambda n: 0.25 * slo.ttft_s))
