"""Hedging a slow first token: a stream whose first bytes take much longer than predicted is
sent to another backend too, and the first to answer serves it (the other is cancelled). The
deadline follows the latency model (gateway.backends.latency_model): `factor` times the least TTFT
predicted among the decision's candidates at their loads (what a healthy one would take: a
backend known to be slow must not earn itself a longer wait), never under `min_s`. So a
backend that turns slow (a stuck prefill, a noisy neighbour) costs its clients about one
deadline, not its whole delay. A stream whose response headers have not come by then is
abandoned for the next candidate (an engine that accepts connections but answers nothing).

Pure: the deadline and the hedge's backend; upstream runs the race.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.config.settings import HedgeConfig
from gateway.routing import Backend
from gateway.routing.curves import Prediction

__all__ = ["hedge_after", "hedge_backend"]


def hedge_after(
    cfg: HedgeConfig, candidates: Iterable[tuple[Prediction | None, int]]
) -> float | None:
    """Seconds to wait for a stream's first bytes before hedging, from the candidates'
    (prediction, load); None: do not hedge."""
    if not cfg.enabled:
        return None
    least = min((p.ttft.at(n) for p, n in candidates if p is not None and p.known), default=0.0)
    return max(cfg.min_s, cfg.factor * least)


def hedge_backend(
    candidates: tuple[Backend, ...], current: str, unusable: frozenset[str] | set[str]
) -> Backend | None:
    """The decision's next candidate after `current` that is usable, else the first usable
    one before it: the policy's own ranking."""
    urls = [b.url for b in candidates]
    at = urls.index(current) if current in urls else -1
    usable = [b for b in candidates if b.url != current and b.url not in unusable]
    for b in usable:
        if urls.index(b.url) > at:
            return b
    return usable[0] if usable else None
