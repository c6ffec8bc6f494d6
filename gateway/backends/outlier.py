"""Outlier detection from the outcomes of real requests (passive health checking), after
Envoy's: a backend is ejected on `consecutive_failures` failures in a row, or when more than
`failure_ratio` of its last `window_s` of attempts failed (at least `min_requests` of them);
it stays out `base_ejection_s` times the number of times it was ejected lately (capped at
`max_ejection_s`), then is on probation: routing may give it one request at a time, and
`trial_successes` successes put it back in full rotation, while one failure ejects it again
for longer. A backend whose credentials the engine refuses (401/403) is ejected at once: that
is the gateway's misconfiguration and no retry fixes it.

No more than `max_ejected_share` of a tier is ejected for its outcomes at once (one backend at
least, as Envoy does): when a whole tier fails, that is load or a shared cause, and ejecting
all of it would only turn errors into refusals. Ejections by the load monitor (a dead or stalled
engine) are apart and not capped: those backends cannot answer at all.

Pure: every method takes the time; the registry applies the verdicts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway.config.settings import OutlierConfig

__all__ = ["Mode", "OutlierState", "Verdict"]


class Mode(enum.Enum):
    ACTIVE = "active"
    EJECTED = "ejected"
    PROBATION = "probation"


class Verdict(enum.Enum):
    """What an outcome asks the registry to do."""

    NONE = "none"
    EJECT = "eject"
    READMIT = "readmit"  # probation passed


@dataclass(slots=True)
class OutlierState:
    """One backend's request outcomes and ejection state."""

    mode: Mode = Mode.ACTIVE
    consecutive: int = 0
    # Outcomes in the current window and the one before it: the ratio is taken over both,
    # the previous one weighted by how much of it is still within `window_s`.
    window_at: float = 0.0
    ok_now: int = 0
    failed_now: int = 0
    ok_before: int = 0
    failed_before: int = 0
    ejections: int = 0  # lately: decays by one per `max_ejection_s` in full rotation
    until: float = 0.0  # end of the current ejection
    trial_ok: int = 0
    calm_since: float = 0.0  # back in full rotation since

    def _roll(self, cfg: OutlierConfig, now: float) -> None:
        elapsed = now - self.window_at
        if elapsed < cfg.window_s:
            return
        if elapsed < 2 * cfg.window_s:
            self.ok_before, self.failed_before = self.ok_now, self.failed_now
        else:
            self.ok_before = self.failed_before = 0
        self.ok_now = self.failed_now = 0
        self.window_at = now - elapsed % cfg.window_s

    def failure_ratio(self, cfg: OutlierConfig, now: float) -> tuple[float, float]:
        """(share of failures, attempts) over the last `window_s`."""
        self._roll(cfg, now)
        w = 1.0 - (now - self.window_at) / cfg.window_s
        failed = self.failed_now + w * self.failed_before
        total = failed + self.ok_now + w * self.ok_before
        return (failed / total if total else 0.0), total

    def succeeded(self, cfg: OutlierConfig, now: float) -> Verdict:
        if now - self.window_at >= cfg.window_s:  # (`_roll`'s test: a call saved per request)
            self._roll(cfg, now)
        self.ok_now += 1
        self.consecutive = 0
        if self.mode is Mode.PROBATION:
            self.trial_ok += 1
            if self.trial_ok >= cfg.trial_successes:
                self.mode, self.calm_since = Mode.ACTIVE, now
                return Verdict.READMIT
        return Verdict.NONE

    def failed(self, cfg: OutlierConfig, now: float, *, fatal: bool = False) -> Verdict:
        """An attempt failed (a 5xx, a connection error, a timeout, a silent stream). `fatal`:
        the engine refused the gateway's credentials."""
        self._roll(cfg, now)
        self.failed_now += 1
        self.consecutive += 1
        if self.mode is Mode.EJECTED:
            return Verdict.NONE  # an attempt started before the ejection
        if fatal or self.mode is Mode.PROBATION:
            return Verdict.EJECT
        if self.consecutive >= cfg.consecutive_failures:
            return Verdict.EJECT
        ratio, total = self.failure_ratio(cfg, now)
        if total >= cfg.min_requests and ratio > cfg.failure_ratio:
            return Verdict.EJECT
        return Verdict.NONE

    def eject(self, cfg: OutlierConfig, now: float) -> float:
        """Out of rotation from `now`; returns for how long."""
        if self.mode is Mode.ACTIVE:
            # Calm time in full rotation forgives earlier ejections, one per max_ejection_s.
            forgiven = int((now - self.calm_since) // cfg.max_ejection_s)
            self.ejections = max(0, self.ejections - forgiven)
        self.ejections += 1
        seconds = min(cfg.base_ejection_s * self.ejections, cfg.max_ejection_s)
        self.mode, self.until, self.trial_ok, self.consecutive = (
            Mode.EJECTED, now + seconds, 0, 0)  # fmt: skip
        self.ok_now = self.failed_now = self.ok_before = self.failed_before = 0
        return seconds

    def tick(self, now: float) -> bool:
        """True when an ejection has just run out: the backend is on probation from now."""
        if self.mode is Mode.EJECTED and now >= self.until:
            self.mode = Mode.PROBATION
            return True
        return False

    def spared(self) -> None:
        """An ejection the cap did not allow: the count starts again."""
        self.consecutive = 0
