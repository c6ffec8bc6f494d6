"""The demand a replica started now will meet: a replica asked for now serves only once it has
started, so the plan covers the demand then. The forecast is deliberately simple: the current
rate, plus its rising trend carried over the start-up time (a falling trend is not carried: a
replica too many costs less than an SLO missed), plus headroom for the forecast's error."""

from __future__ import annotations

__all__ = ["forecast"]


def forecast(rate: float, trend: float, startup_s: float, headroom: float) -> float:
    """Requests per second to plan for: `rate` now (requests/s), rising by `trend` (requests/s
    per second) over `startup_s`, times (1 + `headroom`)."""
    ahead = rate + max(0.0, trend) * startup_s
    return max(0.0, ahead) * (1.0 + headroom)
