"""The latency model: each backend's TPOT and TTFT as functions of its concurrency, learned
online from what the gateway sees, with nothing assumed before the first observation.

Per backend and quantity, a value per knot of concurrency (gateway.routing.curves.KNOTS). An
observation at concurrency c moves the two knots around c by its residual, split by distance,
with a step size that shrinks to 1/`memory` (an exponentially weighted mean over that many
observations per knot): a knot visited often follows change within a few seconds; one that is
not keeps what it learned. The knots' isotonic (non-decreasing) fit is smoothed by a roofline
fitted to it, flat-ish then steeper, as a decode step's time is against the tokens it
processes (streams x tokens verified per stream; the reference measurements of an H200 show it
from 1 to 256 streams): a few noisy knots can neither make more load look faster nor bend the
slope that decides whether one more stream is worth it.

Past the most streams observed (the frontier) the model reasons from the engine, not from
configuration: the step may turn compute-bound anywhere out there. Its ridge is taken as equally
likely at any scale up to `ridge_max` tokens per step, and past a ridge the step grows in
proportion to its tokens. So the predicted TPOT rises past the frontier and carries a doubt
that grows with the distance: one stream past it is nearly the last observed (a request tries
it, and the frontier moves up by evidence); several times past it is a gamble that routing
prices as such (gateway.routing.learned).

Speculative decoding is modelled apart, because it is what moves fastest: TPOT = step time /
tokens per step, and the tokens per step (1 + accepted drafts per verification) come from the
engine's counters, averaged with a half-life of seconds. When that average moves, every knot of
the TPOT curve is rescaled by the ratio (the step time is the hardware's, the acceptance is the
workload's), so a workload shift moves the whole curve at once, not one visited knot at a time.
A finished stream's TPOT is read at the acceptance it ran at (the counters over its own decode),
not at the average still catching up with a shift (BackendModel.observe_request).

A request's TPOT scatters around the curve (its own acceptance, the batch it shared): the
finished streams' log-residuals against the curve give a bias and a spread, from which routing
reads the probability of meeting an SLO, not just whether the mean does.

No clock, no I/O: times come in with the observations (gateway.backends.learner feeds it).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.routing.curves import KNOTS, TABLE_MAX, UNKNOWN_CURVE, Curve, Prediction

__all__ = [
    "UNKNOWN",
    "AcceptanceRate",
    "BackendModel",
    "CurveLearner",
    "EngineSample",
    "LogSpread",
    "PrefillCost",
    "Roofline",
    "beyond",
    "fit_roofline",
    "isotonic",
    "prompt_per_step",
    "with_mate",
]

# What routing sees of a backend nothing has been observed on yet.
UNKNOWN = Prediction(tpot=UNKNOWN_CURVE, ttft=UNKNOWN_CURVE, frontier=0)
# How far the load the streams saw between two scrapes may lie from the scrapes' own, as a
# factor (plus one stream), for the interval's steps to be read at the scrapes' load.
_STEADY = 1.5
# What an interval's step time keeps at least, its prefill taken out (PrefillCost), and how
# much the prefill per step must vary within a load, as a share of its square, to be read.
_LEAST_LEFT = 0.1
_VARIED = 1e-6
# Scrapes of an engine's speculation counters kept to read a finished stream's acceptance: a
# few tens of seconds at the usual scrape intervals, longer than most streams decode.
_KEPT = 64
# How much a knot's neighbour's value counts for it before its own first observation (in
# observations; CurveLearner.observe).
_NEIGHBOUR = 1.0


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
    """The knots of one curve: value, weight (capped at `memory`) and how many observations lie
    behind each. A knot no observation has reached holds nothing."""

    __slots__ = ("high", "low", "memory", "seen", "values", "weights")

    def __init__(self, memory: float) -> None:
        self.values = [0.0] * len(KNOTS)
        self.weights = [0.0] * len(KNOTS)
        self.seen = [0.0] * len(KNOTS)
        # The least and most of the observations that moved each knot: its value is kept
        # between them (`_add`).
        self.low = [math.inf] * len(KNOTS)
        self.high = [-math.inf] * len(KNOTS)
        self.memory = memory

    def observe(self, n: float, y: float, weight: float = 1.0) -> bool:
        """One observation `y` at concurrency `n`. The residual against the current line
        through the two knots around `n` moves both, each by its share of `weight` (a
        gradient step of piecewise-linear least squares: unbiased on a straight segment,
        where averaging `y` into the knots would drag each toward its neighbour). A knot's
        first observation sets it, but beside a knot already seen, whose value it starts from
        as one observation. False: not a usable observation."""
        if not (math.isfinite(y) and y >= 0 and math.isfinite(n)):
            return False
        k = KNOTS
        if n <= k[0]:
            self._add(0, y - self.values[0], weight, y)
            return True
        if n >= k[-1]:
            self._add(len(k) - 1, y - self.values[-1], weight, y)
            return True
        i = 0
        while k[i + 1] < n:
            i += 1
        f = (n - k[i]) / (k[i + 1] - k[i])
        v0, v1 = self.values[i], self.values[i + 1]
        # A knot with nothing yet stands at the other one's value, not at 0: the step flat
        # there, as a roofline is before its ridge, believed as one observation. Taken whole,
        # the first reading of a knot past the load seen (a step that carried a wave's
        # prefill, 1.5 times the others) became the knee there, and routing, believing it,
        # never sent the streams that would have corrected it (docs/results/knot-neighbour).
        if not self.seen[i]:
            if self.seen[i + 1]:
                v0 = self.low[i] = self.high[i] = v1  # (the neighbour's value as one reading)
                self.weights[i] = _NEIGHBOUR
            else:
                v0 = y
        if not self.seen[i + 1]:
            v1 = v0
            if self.seen[i]:
                self.low[i + 1] = self.high[i + 1] = v0
                self.weights[i + 1] = _NEIGHBOUR
        residual = y - (v0 + f * (v1 - v0))
        self.values[i], self.values[i + 1] = v0, v1
        self._add(i, residual, weight * (1 - f), y)
        self._add(i + 1, residual, weight * f, y)
        return True

    def _add(self, i: int, residual: float, w: float, y: float) -> None:
        """Knot `i` moved by its share `w` of `residual`, the observation `y`'s. The value
        stays within the least and most of the observations that moved the knot: a segment's
        two knots are a line fitted to what falls between them, and where those observations
        crowd near one knot and scatter (steps that carried prefills, up to tens of times the
        others), the line's far end swung to values no observation had: knots of a pool
        engine stepping at 13-36 ms read -30 and 121 ms, and their isotonic fit 9.7 ms flat."""
        if w <= 0:
            return
        low, high = self.low, self.high
        if y < low[i]:
            low[i] = y
        if y > high[i]:
            high[i] = y
        self.weights[i] = min(self.weights[i] + w, self.memory)
        v = self.values[i] + (w / self.weights[i]) * residual
        self.values[i] = low[i] if v < low[i] else (high[i] if v > high[i] else v)
        self.seen[i] = min(self.seen[i] + w, self.memory)

    def scale(self, factor: float) -> None:
        if factor > 0 and math.isfinite(factor):
            self.values = [v * factor for v in self.values]
            self.low = [v * factor for v in self.low]
            self.high = [v * factor for v in self.high]

    def points(self) -> list[tuple[int, float]]:
        """(knot, fitted value) of the knots with observations: their isotonic fit."""
        data = [i for i, s in enumerate(self.seen) if s > 0]
        fitted = isotonic([self.values[i] for i in data], [self.weights[i] for i in data])
        return [(KNOTS[i], v) for i, v in zip(data, fitted, strict=True)]


def _through(points: Sequence[tuple[int, float]], upto: int) -> list[float]:
    """The piecewise-linear line through `points` at 0..upto, flat below the first point and
    past the last."""
    out: list[float] = []
    j = 0
    for n in range(upto + 1):
        while j + 1 < len(points) and points[j + 1][0] < n:
            j += 1
        x0, y0 = points[j]
        if n <= x0 or j + 1 == len(points):
            out.append(y0)
        else:
            x1, y1 = points[j + 1]
            out.append(y0 + (y1 - y0) * (n - x0) / (x1 - x0))
    return out


@dataclass(frozen=True, slots=True)
class Roofline:
    """`base + slope * n + steeper * max(0, n - ridge)`: a decode step's time against the
    streams it carries (or TPOT, at fixed tokens per step), memory-bound then compute-bound."""

    base: float
    slope: float = 0.0
    steeper: float = 0.0
    ridge: float = math.inf

    def at(self, n: float) -> float:
        return self.base + self.slope * n + self.steeper * max(0.0, n - self.ridge)


def _solve2(m: tuple[float, float, float], rhs: tuple[float, float]
            ) -> tuple[float, float] | None:  # fmt: skip
    """[[a, b], [b, d]] x = rhs for m = (a, b, d); None if singular."""
    a, b, d = m
    u, v = rhs
    det = a * d - b * b
    if abs(det) < 1e-300:
        return None
    return (u * d - b * v) / det, (a * v - b * u) / det


def _solve3(m: tuple[float, float, float, float, float, float],
            rhs: tuple[float, float, float]) -> tuple[float, float, float] | None:  # fmt: skip
    """[[a, b, c], [b, d, e], [c, e, f]] x = rhs for m = (a, b, c, d, e, f), by the adjugate;
    None if singular."""
    a, b, c, d, e, f = m
    u, v, w = rhs
    c00, c01, c02 = d * f - e * e, c * e - b * f, b * e - c * d
    det = a * c00 + b * c01 + c * c02
    if abs(det) < 1e-300:
        return None
    c11, c12, c22 = a * f - c * c, b * c - a * e, a * d - b * b
    return ((c00 * u + c01 * v + c02 * w) / det, (c01 * u + c11 * v + c12 * w) / det,
            (c02 * u + c12 * v + c22 * w) / det)  # fmt: skip


def fit_roofline(points: Sequence[tuple[int, float, float]]) -> Roofline:
    """The roofline closest to (n, value, weight) points in relative terms (each weighted by
    weight / value^2), with slope and steeper part never negative: the ridge tried at every
    point, and none. One point, or points that fall: flat at their weighted mean.

    Hand-written least squares: the sums past each ridge are suffix sums, so every ridge costs
    two closed-form solves, and a fit's squared error comes from its normal equations (~0.1 ms
    in all for 19 knots; this runs at every refit of every backend)."""
    pts = sorted(points)
    m = len(pts)
    # Suffix sums from i on of w, wx, wxx, wy, wxy (w: the relative weight).
    suf = [(0.0, 0.0, 0.0, 0.0, 0.0)] * (m + 1)
    yy = 0.0
    for i in range(m - 1, -1, -1):
        x, y, w = pts[i]
        w = w / max(y * y, 1e-18)
        s0, s1, s2, s3, s4 = suf[i + 1]
        suf[i] = (s0 + w, s1 + w * x, s2 + w * x * x, s3 + w * y, s4 + w * x * y)
        yy += w * y * y
    sw, swx, swxx, swy, swxy = suf[0]
    best, best_err = Roofline(swy / sw), yy - swy * swy / sw
    line = _solve2((sw, swx, swxx), (swy, swxy)) if m >= 2 else None
    if line is not None and line[1] >= 0:
        b0, b1 = line
        e = yy - 2 * (b0 * swy + b1 * swxy) + b0 * b0 * sw + 2 * b0 * b1 * swx + b1 * b1 * swxx
        if e < best_err:
            best, best_err = Roofline(b0, b1), e
    for j in range(1, m - 1):
        r = float(pts[j][0])
        hw, hwx, hwxx, hwy, hwxy = suf[j + 1]
        sh = hwx - r * hw  # sums with h = max(0, x - r)
        sxh = hwxx - r * hwx
        shh = hwxx - 2 * r * hwx + r * r * hw
        shy = hwxy - r * hwy
        both = _solve3((sw, swx, sh, swxx, sxh, shh), (swy, swxy, shy))
        if both is not None and both[1] >= 0 and both[2] >= 0:
            b0, b1, b2 = both
            e = (yy - 2 * (b0 * swy + b1 * swxy + b2 * shy) + b0 * b0 * sw + b1 * b1 * swxx
                 + b2 * b2 * shh + 2 * (b0 * b1 * swx + b0 * b2 * sh + b1 * b2 * sxh))  # fmt: skip
            if e < best_err:
                best, best_err = Roofline(b0, b1, b2, r), e
        knee = _solve2((sw, sh, shh), (swy, shy))  # flat, then rising
        if knee is not None and knee[1] >= 0:
            b0, b2 = knee
            e = yy - 2 * (b0 * swy + b2 * shy) + b0 * b0 * sw + 2 * b0 * b2 * sh + b2 * b2 * shh
            if e < best_err:
                best, best_err = Roofline(b0, 0.0, b2, r), e
    return best


def beyond(line: Sequence[float], frontier: int, tokens: float, ridge_max: float
           ) -> tuple[list[float], list[float]]:  # fmt: skip
    """The TPOT table at 0..TABLE_MAX, and the doubt about each value (the deviation of its
    log), from the observed roofline `line` (at 0..TABLE_MAX, continued past the data): as
    observed up to the frontier; past it, the step may turn compute-bound (or steeper still)
    anywhere. The ridge, in tokens per step, is taken as equally likely at any
    scale from the frontier's `tokens` to `ridge_max` (log-uniform); past a ridge the step
    grows in proportion to its tokens (the steepest a roofline rises). So at n streams
    ln TPOT = ln line(n) + X, X = 0 while the ridge lies beyond n's tokens, else ln of n over
    the ridge's streams. With U = ln(n / frontier) and L = ln(ridge_max / tokens), while U <= L:
    E[X] = U^2 / 2L and E[X^2] = U^3 / 3L; past it X is uniform on [U - L, U]. One stream past
    the frontier the table is nearly the observed line; a doubling, already a fair chance of the
    knee."""
    table, doubt = list(line[: frontier + 1]), [0.0] * (frontier + 1)
    span = math.log(max(ridge_max / max(tokens, 1e-9), math.e))
    for n in range(frontier + 1, TABLE_MAX + 1):
        u = math.log(n / frontier)
        if u <= span:
            mean = u * u / (2 * span)
            var = u**3 / (3 * span) - mean * mean
        else:
            mean, var = u - span / 2, span * span / 12
        table.append(max(line[n] * math.exp(mean), table[-1]))  # the curve only rises
        doubt.append(math.sqrt(max(var, 0.0)))
    return table, doubt


class AcceptanceRate:
    """Speculative decoding's recent acceptance, from the engine's cumulative counters.

    Each scrape's increments are added to sums that halve every `halflife_s`, so the rates
    follow a workload shift within a few half-lives; a counter that went down (an engine
    restart) starts the count again. The last `_KEPT` scrapes are kept as they came, so that a
    stream's TPOT can be read at the acceptance it ran at (`tokens_per_step_since`), not at
    the average that is still catching up with a shift.
    """

    __slots__ = ("accepted", "draft_tokens", "drafts", "halflife_s", "kept", "last", "last_at")

    def __init__(self, halflife_s: float) -> None:
        self.halflife_s = halflife_s
        self.drafts = self.draft_tokens = self.accepted = 0.0
        self.last: tuple[float, float, float] | None = None
        self.last_at = 0.0
        self.kept: deque[tuple[float, tuple[float, float, float]]] = deque(maxlen=_KEPT)

    def observe(self, totals: tuple[float, float, float], now: float) -> None:
        """`totals`: the counters (drafts, draft tokens, accepted tokens) as scraped at `now`."""
        last, self.last = self.last, totals
        if last is None or any(t < p for t, p in zip(totals, last, strict=True)):
            self.last_at = now
            self.kept.clear()  # counts before a restart are no base for those after it
            self.kept.append((now, totals))
            return
        self.kept.append((now, totals))
        decay = 0.5 ** (max(0.0, now - self.last_at) / self.halflife_s)
        self.last_at = now
        self.drafts = self.drafts * decay + (totals[0] - last[0])
        self.draft_tokens = self.draft_tokens * decay + (totals[1] - last[1])
        self.accepted = self.accepted * decay + (totals[2] - last[2])

    @property
    def tokens_per_step(self) -> float | None:
        """1 + accepted drafts per verification step; None before any draft was seen."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 1e-9 else None

    def tokens_per_step_since(self, since: float) -> float | None:
        """Tokens per step over the scrapes from the last one at or before `since` (the oldest
        kept, if none is; the one before the latest, if that is the latest) to the latest;
        None where no draft was verified in between."""
        kept = self.kept
        if len(kept) < 2:
            return None
        base = kept[0][1]
        # From the latest back (a stream decodes for seconds: a few scrapes, not all kept).
        for i in range(len(kept) - 2, -1, -1):
            at, totals = kept[i]
            if at <= since:
                base = totals
                break
        end = kept[-1][1]
        drafts = end[0] - base[0]
        return 1.0 + (end[2] - base[2]) / drafts if drafts > 0 else None

    @property
    def verified_per_step(self) -> float | None:
        """Tokens each stream puts through a verification step: 1 + drafts proposed."""
        return 1.0 + self.draft_tokens / self.drafts if self.drafts > 1e-9 else None

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 1e-9 else None


class PrefillCost:
    """What the prompts prefilled among the decodes add to a step, learned per backend.

    A step that prefills P prompt tokens beside its decodes takes about `per_token` x P
    longer (chunked prefill: a prompt's tokens are compute-bound, each about the same). Where
    prompts come in waves (a burst of new conversations, each resending its history), the
    scrape intervals at the wave's load carry it: in the routing study's chat workload (a seed
    of `a-lot` burst) single intervals of a throughput engine came out at up to 13 times its
    decode step, and the curve's knots there at 2-5 times, so routing held an engine full
    that had room. So an interval's mean step is read less its prefill. A stream's TPOT is
    taken as it is: its decode spreads over many steps, diluting a wave, and what it took
    with the usual prefill beside it is what a stream will take (measured: read less its
    prefill too, an interactive cell of the chat study, whose SLO only the latency tier
    meets, lost SLO-met requests: docs/results/routing-sim-prefill).

    `per_token` is a regression of the intervals' mean step time on their prefill tokens per
    step within each knot of load (each knot its own mean: the decode step there), pooled
    over the knots (least squares, exponentially weighted). Within a knot the decode step
    drops out; a regression on the curve's residuals instead would let the curve absorb the
    prefill first and learn none of it. The same regression reads a request's prefill time
    against its prompt tokens computed (BackendModel._learn_prompt).
    """

    __slots__ = ("count", "mean", "memory", "spp", "sxx", "sxy")

    def __init__(self, memory: float) -> None:
        self.memory = memory
        self.sxx = self.sxy = 0.0
        self.spp = 0.0  # the prefill per step squared: its scale, to tell variation from none
        # Per knot: the intervals' (prefill per step, step time) means and how many.
        self.mean = [(0.0, 0.0)] * len(KNOTS)
        self.count = [0.0] * len(KNOTS)

    @property
    def per_token(self) -> float:
        # Nothing while the prefill per step has not varied within a load (by more than
        # rounding): the slope would be noise over noise.
        if self.sxx <= _VARIED * self.spp:
            return 0.0
        return max(0.0, self.sxy / self.sxx)

    def learn(self, n: float, per_step: float, step_s: float) -> None:
        """One interval: its mean load, prompt tokens computed per step and mean step time."""
        if not (math.isfinite(step_s) and math.isfinite(per_step) and per_step >= 0):
            return
        k = min(range(len(KNOTS)), key=lambda i: abs(KNOTS[i] - n))
        count = self.count[k] = min(self.count[k] + 1, self.memory)
        mp, ms = self.mean[k]
        dp, ds = per_step - mp, step_s - ms
        mp, ms = mp + dp / count, ms + ds / count
        self.mean[k] = (mp, ms)
        # Welford's co-moments within the knot, pooled (the first interval at a knot adds
        # nothing: it only sets the knot's means); older ones weigh less.
        keep = 1.0 - 1.0 / (self.memory * len(KNOTS))
        self.sxx = self.sxx * keep + dp * (per_step - mp)
        self.sxy = self.sxy * keep + dp * (step_s - ms)
        self.spp = self.spp * keep + per_step * per_step

    def without(self, per_step: float, step_s: float) -> float:
        """An interval's mean step less its prefill (never below a tenth of it: a cost per
        token still too high early on would teach steps of nothing)."""
        return max(step_s - self.per_token * per_step, step_s * _LEAST_LEFT)


class LogSpread:
    """Mean and deviation of ln(observed / predicted), each an exponentially weighted mean over
    `memory` observations, starting from `prior` (deviation) worth `prior_weight` of them."""

    __slots__ = ("bias", "count", "memory", "var")

    def __init__(self, memory: float, prior: float, prior_weight: float) -> None:
        self.memory = memory
        self.bias = 0.0
        self.var = prior * prior
        self.count = prior_weight

    def observe(self, ratio: float) -> None:
        if not (ratio > 0 and math.isfinite(ratio)):
            return
        r = math.log(ratio)
        self.count = min(self.count + 1, self.memory)
        w = 1 / self.count
        d = r - self.bias
        self.bias += w * d
        self.var += w * (d * (r - self.bias) - self.var)

    @property
    def deviation(self) -> float:
        return math.sqrt(max(self.var, 0.0))


def prompt_per_step(last: EngineSample, sample: EngineSample, n: float) -> float:
    """The prompt tokens computed per engine step between two scrapes (both with `prefilled`
    and inter-token counts), `n` the streams running on average: over the engine's own count
    of its steps where it gives one; else over the inter-token samples, one per stream
    decoding in a step, as if all `n` were. (That guess overstates it where streams were
    prefilling, not decoding: the interval that a burst of chats began in, 5 streams decoding
    and 17 prefilling, read 333 prompt tokens a step where its 8 steps took 123 each.)"""
    tokens = max(0.0, (sample.prefilled or 0.0) - (last.prefilled or 0.0))
    if sample.steps is not None and last.steps is not None and sample.steps > last.steps:
        return tokens / (sample.steps - last.steps)
    samples = (sample.itl_count or 0.0) - (last.itl_count or 0.0)
    return tokens * n / samples if samples > 0 else 0.0


def _steady(last: EngineSample, sample: EngineSample) -> bool:
    """Whether the interval's inter-token samples were taken at about the load the two scrapes
    show, by this gateway's leases: their count weighted by itself (a step with n streams gives
    n samples) within a factor `_STEADY` (and a stream) of the counts at the scrapes. A burst
    that came and went between them would have its busy steps read at the scrapes' quiet
    load, the curve steep where it is flat (a lull the converse): such an interval is not
    learned from. (Reading it at the weighted count instead measured worse in the routing
    study: leases still in an engine's frontend give no samples, which may overstate the
    load.) Steady where the leases are not known, or where the engine queued at both scrapes
    (leases waiting there give no samples; its running count is right then)."""
    if last.leases is None or sample.leases is None or (last.waiting and sample.waiting):
        return True
    area = sample.leases[0] - last.leases[0]
    if area <= 0:
        return True
    seen = (sample.leases[1] - last.leases[1]) / area
    ends = (last.leases[2], sample.leases[2])
    return min(ends) / _STEADY - 1 <= seen <= max(ends) * _STEADY + 1


@dataclass(frozen=True, slots=True)
class EngineSample:
    """What one scrape of an engine says, summed over its models."""

    running: float
    itl_sum: float | None = None  # inter-token latency histogram: one sample per engine step
    itl_count: float | None = None
    spec: tuple[float, float, float] | None = None  # drafts, draft tokens, accepted tokens
    waiting: float = 0.0
    # This gateway's leases on the engine at the scrape: the integrals of their count and of
    # its square, and the count (gateway.backends.registry.BackendEntry.load_marks); None
    # where not known.
    leases: tuple[float, float, int] | None = None
    # Prompt tokens the engine has computed (prefilled, less those found in its prefix
    # cache), cumulative; None where the engine does not say.
    prefilled: float | None = None
    # The requests prefilled, cumulative: their prefill times' sum, their prompt tokens
    # computed, and how many; None where the engine does not say.
    prefill: tuple[float, float, float] | None = None
    # The engine's steps, cumulative; None where the engine does not say.
    steps: float | None = None


class BackendModel:
    """One backend's learners: TPOT and TTFT curves, the frontier, the spread of requests
    around the TPOT curve, and the speculative acceptance."""

    def __init__(
        self, memory: float, halflife_s: float, spread: float, ridge_max: float
    ) -> None:
        self.ridge_max = ridge_max
        self.tpot = CurveLearner(memory)  # at the tokens per step `tps`
        self.ttft = CurveLearner(memory)
        self.acceptance = AcceptanceRate(halflife_s)
        self.prefill = PrefillCost(4 * memory)
        # What a prompt token costs a request's prefill, read from the engine's prefill times
        # (what a conversation's history costs where it is not cached: gateway.routing.affinity).
        self.prompt = PrefillCost(4 * memory)
        self.spread = LogSpread(4 * memory, spread, 2.0)
        # How far a finished stream's own acceptance lies from the average, ln of the ratio:
        # its usual scatter, against which a shift is told from noise (`observe_request`).
        # (Its prior: as wide as a request's TPOT is taken to scatter before any is seen.)
        self.lag = LogSpread(4 * memory, spread, 2.0)
        self.tps: float | None = None  # the tokens per step the TPOT curve is scaled to
        self.frontier = 0
        self.observed_at: float | None = None
        self._last: EngineSample | None = None
        self._last_at = 0.0  # when it was scraped
        # The TPOT table of the last prediction, and the frontier it was drawn to.
        self._table: list[float] | None = None
        self._drawn_to = 0

    def observe_engine(self, sample: EngineSample, now: float) -> None:
        """One scrape: acceptance first (it rescales the curve), then the step time it saw."""
        last, self._last = self._last, sample
        span, self._last_at = now - self._last_at, now
        if last is not None:
            self._learn_prompt(last, sample, span)
        if sample.spec is not None:
            self.acceptance.observe(sample.spec, now)
            tps = self.acceptance.tokens_per_step
            if tps is not None:
                if self.tps is not None:
                    self.tpot.scale(self.tps / tps)
                    if self._table is not None:
                        self._table = [v * self.tps / tps for v in self._table]
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
        if not _steady(last, sample):
            return
        n = (sample.running + last.running) / 2
        if sample.prefilled is not None and last.prefilled is not None:
            per_step = prompt_per_step(last, sample, n)
            self.prefill.learn(n, per_step, step_s)
            if per_step and steps < n:
                # Fewer inter-token samples than streams: most of them were prefilling, not
                # decoding (a wave of new prompts landed), and the few steps seen carried
                # the wave's prefill: a step of the prefill, not of decoding at this load.
                return
            step_s = self.prefill.without(per_step, step_s)
        if self.tpot.observe(n, step_s / (self.tps or 1.0)):
            # Held for the whole interval: the fewer of the two ends.
            self.frontier = max(self.frontier, int(min(sample.running, last.running)))
            self.observed_at = now

    def _learn_prompt(self, last: EngineSample, sample: EngineSample, span: float) -> None:
        """One interval of `span` s: its mean prefill time against the mean prompt tokens
        computed, of the requests counted in it (an engine counts both of a request at once;
        vLLM when it finishes, at the load then, which scatters the readings): within a load,
        the slope is a prompt token's prefill time.

        Not from an interval whose prefills overlapped (their times add up to more than the
        interval): prompts that share the steps' prefill budget are each timed with the
        others' tokens, and a wave of new conversations read so taught the routing study's
        engines 20-75 times their cost per token (docs/results/conversations-prefill-priced)."""
        a, b = last.prefill, sample.prefill
        if a is None or b is None:
            return
        took, tokens, count = b[0] - a[0], b[1] - a[1], b[2] - a[2]
        if count < 1 or took < 0 or tokens < 0 or took > span:
            return  # none prefilled, a restarted engine, or prefills that overlapped
        self.prompt.learn((sample.running + last.running) / 2, tokens / count, took / count)

    def observe_request(self, at: float, tpot: tuple[float, float] | None,
                        ttft: tuple[float, float] | None, since: float | None = None
                        ) -> None:  # fmt: skip
        """One finished stream seen at the gateway: (concurrency, TPOT) over its decode, which
        began at `since`, and (concurrency it joined, TTFT).

        The TPOT curve is kept at the tokens per step `tps`, an average that follows a shift
        of acceptance over a few half-lives. The stream ran at the acceptance of its own
        time, which the engine's counters since `since` tell: its TPOT is put in the curve's
        units by the ratio of the two. Taken as it is, a stream timed just after acceptance
        fell would count the fall twice, once in its TPOT and again when the average caught
        up and rescaled the curve; and the load where it ran would look too slow to use.

        The ratio is shrunk toward 1 by its usual scatter (James-Stein: by the share of its
        square that the scatter explains): outside a shift it is mostly the stream's own
        acceptance, a part of the engine's average, and dividing that out would read a
        stream slowed by its own drafts as a fast one (measured: the knife-edge cells of the
        routing study lost up to 4% of their SLO-met requests with the ratio taken whole)."""
        if tpot is not None:
            n, y = tpot
            if since is not None and self.tps is not None:
                ran_at = self.acceptance.tokens_per_step_since(since)
                if ran_at is not None and ran_at > 0:
                    d = math.log(ran_at / self.tps)
                    usual = self.lag.var + self.lag.bias**2
                    # Learned clipped to 3 deviations, so that a shift does not teach that
                    # shifts are usual (a Winsorized scale).
                    bound = 3.0 * math.sqrt(usual)
                    self.lag.observe(math.exp(max(-bound, min(bound, d))))
                    if d * d > usual:
                        y *= math.exp(d * (1.0 - usual / (d * d)))
            expected = 0.0
            if self._table is not None and 1 <= n <= self._drawn_to + 1:
                expected = self._at(n)
            if expected > 0:  # (an engine that streams whole answers at once has a TPOT of 0)
                self.spread.observe(y / expected)
            if self.tpot.observe(n, y):
                self.frontier = max(self.frontier, int(n))
        if ttft is not None:
            self.ttft.observe(*ttft)
        self.observed_at = at

    def _at(self, n: float) -> float:
        assert self._table is not None
        i = min(int(n), TABLE_MAX - 1)
        f = min(n - i, 1.0)
        return self._table[i] + f * (self._table[i + 1] - self._table[i])

    def prediction(self) -> Prediction:
        points = self.tpot.points()
        if not points or self.frontier < 1:
            return UNKNOWN
        frontier = min(self.frontier, TABLE_MAX - 1)
        roof = fit_roofline([(k, v, self.tpot.weights[KNOTS.index(k)]) for k, v in points])
        # Never below its value at the fewest streams observed (the knot's own where the fit's
        # is not positive): the line only rises, so below them it is flat, as a memory-bound
        # step is. Carried down from loads seen only in a burst, it fell to nothing at one
        # stream, and a pool engine predicted to decode in no time drew an idle chat's first
        # turn from the latency engine (docs/results/below-data).
        floor = roof.at(points[0][0])
        if floor <= 0:
            floor = points[0][1]
        line = [max(roof.at(n), floor) for n in range(TABLE_MAX + 1)]
        # Even where the fit shows a steeper part inside the data, past them the step may
        # steepen again as far as the model can tell (a fit's ridge may be noise).
        tokens = frontier * (self.acceptance.verified_per_step or 1.0)
        table, doubt = beyond(line, frontier, tokens, self.ridge_max)
        self._table, self._drawn_to = table, frontier
        # TTFT past its data: as at the most streams observed (it grows by queueing, which
        # the scraped queue shows, not by the step's roofline).
        ttft = self.ttft.points()
        return Prediction(
            tpot=Curve.tabled(table, self.tpot.seen),
            ttft=Curve.tabled(_through(ttft, TABLE_MAX) if ttft
                              else [0.0] * (TABLE_MAX + 1), self.ttft.seen),
            tokens_per_step=self.tps or 1.0,
            acceptance=self.acceptance.rate,
            observed_at=self.observed_at,
            frontier=frontier,
            spread=self.spread.deviation,
            bias=self.spread.bias,
            doubt=tuple(doubt),
            prefill_s=self.prompt.per_token,
        )  # fmt: skip


def with_mate(own: Prediction, mate: Prediction, unlike: float) -> Prediction:
    """`own` past its frontier, told what a tier-mate has seen further out: the mate's TPOT
    curve, scaled to `own`'s at `own`'s frontier, as a second guess beside `own`'s ridge prior,
    the two combined by their precision (in ln TPOT, as routing reads them). The mate's guess
    carries the mate's own doubt there and `unlike` per e-fold of load past `own`'s frontier
    (engines of a tier are replicas, but an operator may mix unlike ones). Up to the frontier,
    and where the mate has seen no further, `own` unchanged.

    Past the mate's frontier both guesses are ridge priors, the mate's the better informed (it
    knows of no ridge up to its frontier): the less doubtful of the two is taken, not the two
    combined, which would count the one doubt twice. (Combined, the replicas seen least looked
    surer, and slower, far out than the one seen most, and a burst piled onto that one: 46
    streams against 5 on two like pool engines, in `bench routing-sim`'s `knee-32` burst, 4 ms
    class, with conversations: docs/results/mate-past-frontier.)"""
    f = own.frontier
    if not own.known or not mate.known or mate.frontier <= f or not own.doubt:
        return own
    mine, theirs = own.tpot.table, mate.tpot.table
    if mine[f] <= 0 or theirs[f] <= 0:
        return own
    shift = math.log(mine[f] / theirs[f])
    table, doubt = list(mine[: f + 1]), list(own.doubt[: f + 1])
    mate_doubt = mate.doubt or (0.0,) * (TABLE_MAX + 1)
    for n in range(f + 1, TABLE_MAX + 1):
        v1 = own.doubt[n] ** 2
        d2 = unlike * math.log(n / f)
        v2 = mate_doubt[n] ** 2 + d2 * d2
        if mine[n] <= 0 or theirs[n] <= 0:
            table.append(max(mine[n], table[-1]))
            doubt.append(own.doubt[n])
            continue
        m1, m2 = math.log(mine[n]), math.log(theirs[n]) + shift
        if n > mate.frontier:
            mean, var = (m2, v2) if v2 < v1 else (m1, v1)
        elif v1 + v2 <= 0:
            mean, var = m2, 0.0
        else:
            mean, var = (m1 * v2 + m2 * v1) / (v1 + v2), v1 * v2 / (v1 + v2)
        table.append(max(math.exp(mean), table[-1]))  # the curve only rises
        doubt.append(math.sqrt(var))
    return replace(own, tpot=Curve.tabled(table, own.tpot.evidence), doubt=tuple(doubt))


def mate_prior(mate: Prediction, unlike: float) -> Prediction:
    """What a backend that joined a tier (found by discovery) and has seen nothing yet starts
    from: its busiest tier-mate's curves, each point `unlike` more in doubt (ln TPOT), as if one
    stream had been seen there (frontier 1, so that routing weighs it as known) and never when
    (so that exploration still counts it unseen). Its own observations replace it."""
    doubt = mate.doubt or (0.0,) * (TABLE_MAX + 1)
    return replace(mate, frontier=1, observed_at=None,
                   doubt=tuple(math.hypot(d, unlike) for d in doubt))  # fmt: skip
