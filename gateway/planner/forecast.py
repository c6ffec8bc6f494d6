"""The demand a replica started now will meet: a replica asked for now serves only once it has
started, so the plan covers the demand then. The forecast is deliberately simple: the current
rate, plus its rising trend carried over the start-up time (a falling trend is not carried: a
replica too many costs less than an SLO missed), plus headroom for the forecast's error.

In a surge the forecast is read from seconds of arrivals, and every replica it asks for is still
to start: start-ups spread over up to the start-up time, so of replicas asked for at once about
half serve by halfway through it (evenly spread). Asking `surge_factor` x the forecast has the
forecast's worth serving that much sooner; the rest go back once the surge is over (after the
autoscaler's scale-down window)."""

from __future__ import annotations

__all__ = ["forecast"]


def forecast(
    rate: float, trend: float, startup_s: float, headroom: float, surge_factor: float = 1.0
) -> float:
    """Requests per second to plan for: `rate` now (requests/s), rising by `trend` (requests/s
    per second) over `startup_s`, times (1 + `headroom`), times `surge_factor` (a surging
    class's; 1 otherwise)."""
    ahead = rate + max(0.0, trend) * startup_s
    return max(0.0, ahead) * (1.0 + headroom) * surge_factor
