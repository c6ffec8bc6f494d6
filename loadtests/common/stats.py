"""The statistics benches share: percentiles, medians that skip missing values, ratios,
latency samples per target and round with their CPU, the rotation of targets over rounds, and
milliseconds as tables show them."""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtests.harness.procs import cpu_times


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def cpu_spent(before: tuple[float, float], after: tuple[float, float]) -> tuple[float, float]:
    """(user + system, system) CPU seconds used between two readings of `cpu_split`."""
    system = after[1] - before[1]
    return after[0] - before[0] + system, system


def cpu_split(pids: Sequence[int]) -> tuple[float, float]:
    """The user and the system CPU time (s) the processes have used so far, summed (a process
    gone counts nothing)."""
    user = system = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            u, s = cpu_times(pid)
            user, system = user + u, system + s
    return user, system



@dataclass
class Samples:
    """Latencies (seconds) of one measurement on one target (one round, or pooled over rounds)."""

    values: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0  # time from the first scheduled start to the last answer, summed
    cpu_s: float = 0.0  # CPU the serving process(es) used over the same window
    system_s: float = 0.0  # of it, the system's (the kernel's, on the processes' behalf)

    def add(self, ok: bool, latency: float) -> None:
        if ok:
            self.values.append(latency)
        else:
            self.errors += 1

    def charge(self, before: tuple[float, float], after: tuple[float, float]) -> None:
        """The CPU used between two readings of `cpu_split`."""
        self.cpu_s, self.system_s = cpu_spent(before, after)

    @property
    def completed(self) -> int:
        """Requests answered in the window, errors included: they cost CPU too."""
        return len(self.values) + self.errors

    @classmethod
    def pool(cls, rounds: Sequence[Samples]) -> Samples:
        out = cls()
        for s in rounds:
            out.values += s.values
            out.errors += s.errors
            out.wall_s += s.wall_s
            out.cpu_s += s.cpu_s
            out.system_s += s.system_s
        return out


@dataclass(frozen=True)
class Stat:
    n: int
    errors: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    achieved_rps: float

    @classmethod
    def of(cls, s: Samples) -> Stat:
        ms = [v * 1000 for v in s.values]
        return cls(
            n=len(ms),
            errors=s.errors,
            p50_ms=percentile(ms, 50),
            p99_ms=percentile(ms, 99),
            mean_ms=sum(ms) / len(ms) if ms else math.nan,
            achieved_rps=(len(ms) + s.errors) / s.wall_s if s.wall_s > 0 else math.nan,
        )


@dataclass(frozen=True)
class Added:
    """A proxy's percentiles minus direct's (ms), and divided by them."""

    p50_ms: float
    p99_ms: float
    p50_ratio: float
    p99_ratio: float

    @classmethod
    def of(cls, proxy: Stat, direct: Stat) -> Added:
        return cls(
            p50_ms=proxy.p50_ms - direct.p50_ms,
            p99_ms=proxy.p99_ms - direct.p99_ms,
            p50_ratio=ratio(proxy.p50_ms, direct.p50_ms),
            p99_ratio=ratio(proxy.p99_ms, direct.p99_ms),
        )


@dataclass(frozen=True)
class Cpu:
    """CPU of the serving process per completed request (ms): per round, and their median (the
    rounds run at different moments of a shared machine: the median resists one bad round)."""

    ms_per_request: float
    rounds: list[float]
    cpu_s: float  # summed over rounds
    requests: int  # completed, summed over rounds
    system_rounds: list[float]  # of each round's, the system's (ms per request)

    @classmethod
    def of(cls, rounds: Sequence[Samples]) -> Cpu:
        per = [ratio(1000 * s.cpu_s, s.completed) for s in rounds]
        return cls(
            ms_per_request=median(per),
            rounds=per,
            cpu_s=sum(s.cpu_s for s in rounds),
            requests=sum(s.completed for s in rounds),
            system_rounds=[ratio(1000 * s.system_s, s.completed) for s in rounds],
        )


def rotation(names: Sequence[str], r: int) -> list[str]:
    """Round r's order: the list rotated by r, so every target takes every slot in turn."""
    k = r % len(names)
    return [*names[k:], *names[:k]]


def json_safe(value: Any, digits: int | None = None) -> Any:
    """`value` with NaN and infinities as null (JSON has neither), through dicts, lists and
    tuples; with `digits`, floats rounded to that many significant digits."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return value if digits is None else float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: json_safe(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, digits) for v in value]
    return value


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(value: float | None, digits: int = 1, unit: str = "") -> str:
    """A time in milliseconds as tables show it: `digits` decimals, then `unit`; "-" when
    there is none (None or NaN)."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}{unit}"


def ms_of_s(seconds: float | None, digits: int = 1, unit: str = "") -> str:
    """`ms` of a time in seconds."""
    return ms(None if seconds is None else seconds * 1000, digits, unit)
