"""What one replica serves within an SLO class, read from its learned latency curves.

A replica with n streams running answers each in TTFT(n) + L x TPOT(n) for L output tokens, so
by Little's law it completes n / (TTFT(n) + L x TPOT(n)) requests per second. Within the class's
SLO means at a concurrency where a stream meets the TPOT SLO with at least the planned
probability (the curve's observed spread, as the learned policy reads it) and the first token
comes within the TTFT SLO. The capacity is the most such a replica completes at any such
concurrency up to the most streams it has been seen to run (its frontier): past the knee more
streams do not help, and past the frontier the curve is the model's guess, which routing may
explore one stream at a time but a plan must not count on (a planner that read the guess
found one pool replica enough for a load that queued on it). The frontier rises with the load
a replica is given, so the capacity read grows with the evidence.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from gateway.routing.curves import Prediction
from gateway.routing.learned import met
from gateway.routing.types import Slo

__all__ = ["capacity", "tier_capacity"]


def capacity(
    pred: Prediction, slo: Slo, output_tokens: float, attainment: float, max_streams: int
) -> float:
    """Requests per second one replica with curves `pred` completes within `slo` for answers
    of `output_tokens`, each stream meeting the TPOT SLO with probability >= `attainment`, up
    to `max_streams` at once (the engine's batch limit); 0 where no concurrency meets it."""
    best = 0.0
    log_slo = slo.log_tpot
    for n in range(1, max_streams + 1):
        ttft, tpot = pred.ttft.at(n), pred.tpot.at(n)
        if ttft > slo.ttft_s or met(log_slo, n, pred) < attainment:
            # A curve rises with load: once past the SLO it stays past (a dip of noise in a
            # learned curve past this point is not capacity to plan on).
            break
        e2e = ttft + output_tokens * tpot
        if e2e > 0:
            best = max(best, n / e2e)
        else:
            return math.inf
    return best


def tier_capacity(
    preds: Sequence[Prediction], slo: Slo, output_tokens: float, attainment: float,
    max_streams: int,
) -> float:  # fmt: skip
    """A tier's capacity per replica: the median of its replicas', each up to its frontier
    (replicas of one tier run the same engine; the median leaves out one that is slow for a
    reason of its own)."""
    if not preds:
        return 0.0
    return statistics.median(
        capacity(p, slo, output_tokens, attainment, min(max_streams, p.frontier)) for p in preds
    )
