"""The demand per SLO class lately: arrival rate, its trend, and the mean answer length, from the
gateway's own requests.

Arrivals are counted when a request is first routed (before admission: a request refused for
want of room is demand all the same, and a rate of completions would stop rising at the
capacity it should reveal). Two exponentially weighted rates with time constants tau and 4 tau
follow the arrivals; on a rate rising linearly by b per second such an average lags the rate by
b x its time constant, so the two differ by 3 tau x b: the trend is read from their gap, and
on a rise the rate now is the short one plus its lag (Holt's linear trend, from two averages
instead of a fitted line: two numbers per class, updated in O(1)). On a fall the short average
stands: a drop read as a steep decline would be carried below zero within a time constant,
and a plan that undershoots misses SLOs where one that overshoots costs a replica a while.

A surge outruns both: a flash crowd of five times the rate within a minute has risen most of the
way before an average of a minute's constant has moved, and a replica asked for late serves late. A
third average, of a much shorter constant (`surge_tau_s`), watches for it: once it stands more than
`SURGE_Z` standard deviations above the rate read from the other two (the deviation of such an
average over a steady Poisson process of that rate: sqrt(rate / (2 x surge_tau_s))), the rise is no
noise, and its rate and the slope between it and the short average are read instead, until the
other two have come within `SURGE_END_Z` deviations of it (a step read by them alone lags for a few
of their time constants). The slope of a rise seconds old is read against a fourth average of 4x
the fast one's constant: the short average has barely moved then, and its gap to the fast one gives
a small part of the slope (a sixth, 16 s into a rise of x5 within a minute, with the defaults,
where the fourth gives two fifths). A surge must also stand `margin` (the plan's headroom)
above the rate read: at hundreds of requests per second the noise is a few percent of the rate,
and a smooth rise outruns averages of a minute by more than that, which the plan's headroom
already covers. Read from the fast average always, the rate would be noisy, and
an autoscaler that scales down only after the highest of its recent recommendations (Kubernetes'
stabilization window) would keep every noisy peak.

Answer lengths are averaged over finished requests with the short time constant.

Time comes in with every call (no clock read here); the caller owns the one instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.planner.replicas import ClassDemand
from gateway.routing.types import Slo

__all__ = ["Demand", "class_name"]

# The long average's time constant, in short ones.
_LONG = 4.0
# How far (in standard deviations of the fast average, were the rate steady) the fast average
# must stand above the rate read from the other two for a surge. Rare by chance: a steady
# Poisson rate puts it there about once in 30,000 independent reads.
SURGE_Z = 4.0
# ... and once in a surge, how close (the same units) it must come back before the other two are
# read again: a step read by them alone lags for a few of their time constants.
SURGE_END_Z = 1.0


def class_name(slo: Slo) -> str:
    """A class's name in metrics and /state: its two bounds, in ms."""
    return f"ttft<={slo.ttft_s * 1000:g}ms,tpot<={slo.tpot_s * 1000:g}ms"


@dataclass(slots=True)
class _Class:
    slo: Slo
    short: float = 0.0  # requests/s, time constant tau
    long: float = 0.0  # requests/s, time constant _LONG x tau
    fast: float = 0.0  # requests/s, time constant surge_tau
    mid: float = 0.0  # requests/s, time constant _LONG x surge_tau
    surge: bool = False  # read as a surge when last read
    at: float = 0.0  # when the rates were last brought up to date
    born: float = 0.0  # its first request
    tokens: float = 0.0  # mean output tokens of finished requests
    tokens_weight: float = 0.0  # 0: none finished yet
    tokens_at: float = 0.0


class Demand:
    """Per SLO class, the arrival rate and its trend, and the mean answer length."""

    def __init__(
        self, tau_s: float, default_output_tokens: float, surge_tau_s: float, margin: float = 0.0
    ) -> None:
        if not 0 < surge_tau_s < tau_s:
            raise ValueError("surge_tau_s must be positive and shorter than tau_s")
        self.tau_s, self.surge_tau_s = tau_s, surge_tau_s
        # A surge must also stand this share above the rate read: a rise the plan's headroom
        # covers is no surge. At hundreds of requests per second the noise is a few percent
        # of the rate, and a day's rise, compressed into an hour, outruns averages of a minute
        # by more than that without being anything the steady plan does not meet.
        self.margin = margin
        # Assumed for a class until one of its requests has finished.
        self.default_output_tokens = default_output_tokens
        self._classes: dict[Slo, _Class] = {}

    def _class(self, slo: Slo, now: float) -> _Class:
        c = self._classes.get(slo)
        if c is None:
            c = self._classes[slo] = _Class(slo, at=now, born=now)
        return c

    def _decay(self, c: _Class, now: float) -> None:
        dt = now - c.at
        if dt > 0:
            c.short *= math.exp(-dt / self.tau_s)
            c.long *= math.exp(-dt / (_LONG * self.tau_s))
            c.fast *= math.exp(-dt / self.surge_tau_s)
            c.mid *= math.exp(-dt / (_LONG * self.surge_tau_s))
            c.at = now

    def arrived(self, slo: Slo, now: float) -> None:
        """A request of class `slo` arrived at `now`."""
        c = self._classes.get(slo) or self._class(slo, now)  # (a call saved per request)
        self._decay(c, now)
        # An impulse of 1/tau into an average of time constant tau: one arrival per second
        # keeps it at 1 request/s.
        c.short += 1.0 / self.tau_s
        c.long += 1.0 / (_LONG * self.tau_s)
        c.fast += 1.0 / self.surge_tau_s
        c.mid += 1.0 / (_LONG * self.surge_tau_s)

    def finished(self, slo: Slo, output_tokens: int, now: float) -> None:
        """A request of class `slo` ended at `now` with `output_tokens` generated."""
        c = self._classes.get(slo) or self._class(slo, now)
        # A weighted mean whose old weight decays with the short time constant.
        old = c.tokens_weight * math.exp(-max(0.0, now - c.tokens_at) / self.tau_s)
        c.tokens_weight, c.tokens_at = old + 1.0, now
        c.tokens += (output_tokens - c.tokens) / c.tokens_weight

    def classes(self, now: float) -> list[ClassDemand]:
        """Every class seen, with its rate and trend at `now` (a class idle for long has a rate
        near 0: it is kept, and costs nothing to plan)."""
        out = []
        fast = self.surge_tau_s
        for c in self._classes.values():
            self._decay(c, now)
            # Nothing is known of the time before a class's first request (the gateway may
            # just have started): each average is divided by the weight it has gathered since
            # (1 - exp(-age / its constant)), so a class that comes at a steady rate reads
            # that rate from its first seconds, not a climb from 0 (read as a rise, and a
            # surge). Its first request counts as a time constant of the fast average old.
            age = max(now - c.born, fast)
            short = c.short / -math.expm1(-age / self.tau_s)
            long = c.long / -math.expm1(-age / (_LONG * self.tau_s))
            quick = c.fast / -math.expm1(-age / fast)
            mid = c.mid / -math.expm1(-age / (_LONG * fast))
            trend = (short - long) / ((_LONG - 1.0) * self.tau_s)
            rate = short + max(0.0, trend) * self.tau_s
            # (A rate near 0 is floored at one arrival per surge time constant.)
            z = (quick - rate) / math.sqrt(max(rate, 1.0 / fast) / (2.0 * fast))
            rising = z > SURGE_Z and quick > rate * (1.0 + self.margin)
            c.surge = surge = z > SURGE_END_Z if c.surge else rising
            if surge:
                # The rise as the fast average sees it against the short and the mid one: on a
                # linear rise each lags by the slope x its time constant, once the rise is a
                # few of them old (the mid one's first).
                trend = max(trend, (quick - short) / (self.tau_s - fast),
                            (quick - mid) / ((_LONG - 1.0) * fast))
                rate = quick + trend * fast
            tokens = c.tokens if c.tokens_weight else self.default_output_tokens
            out.append(ClassDemand(class_name(c.slo), c.slo, rate, tokens, trend, surge))
        return out
