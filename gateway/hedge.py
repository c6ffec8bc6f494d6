"""Hedging a slow first token: a stream whose first bytes take much longer than its backend's
predicted TTFT is sent to another backend too, and the first to answer serves it (the other is
cancelled). The deadline follows the latency model (gateway.latency_model): `factor` times the
TTFT predicted at the backend's load, never under `min_s`, so a backend that turns slow (a
stuck prefill, a noisy neighbour) costs its clients about one deadline, not its whole delay.

Pure: the deadline and the hedge's backend; upstream runs the race.
"""

from __future__ import annotations

from gateway.routing import Backend
from gateway.routing.curves import Prediction
from gateway.settings import HedgeConfig

__all__ = ["hedge_after", "hedge_backend"]


def hedge_after(cfg: HedgeConfig, pred: Prediction | None, load: int) -> float | None:
    """Seconds to wait for a stream's first bytes before hedging; None: do not hedge."""
    if not cfg.enabled:
        return None
    predicted = pred.ttft.at(load) if pred is not None else 0.0
    return max(cfg.min_s, cfg.factor * predicted)


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
