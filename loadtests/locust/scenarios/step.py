"""Stepped load: 1 -> 16 -> 32 -> 64 -> 16 -> 1 users (or --steps), --phase-seconds each
(default 30).

    locust -f loadtests/locust/scenarios/step.py --headless -H http://127.0.0.1:8000 --phase-seconds
    30
    locust -f loadtests/locust/scenarios/step.py --headless -H http://127.0.0.1:8000 --steps 2,24,1

Users are added or removed at once at each step. A removed user's request in flight is abandoned
(the engine sees a disconnect) unless --stop-timeout S lets it finish. Per-phase percentiles:
`python -m loadtests.locust.summarize --by-users FILE.jsonl` (each record has the users running when
it was sent).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from locust import LoadTestShape

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # where locustfile.py is
from locustfile import LLMUser  # noqa: F401  (the user class Locust runs)

STEPS = (1, 16, 32, 64, 16, 1)
DEFAULT_PHASE_S = 30.0


def steps(text: str) -> tuple[int, ...]:
    """--steps: users per phase, comma-separated; empty: STEPS."""
    if not text.strip():
        return STEPS
    users = tuple(int(part) for part in text.split(","))
    if any(u < 0 for u in users):
        raise ValueError(f"--steps: users cannot be negative: {text!r}")
    return users


class StepShape(LoadTestShape):
    def tick(self) -> tuple[int, float] | None:
        o: Any = self.runner.environment.parsed_options if self.runner else None
        phase = (o.phase_seconds if o else 0.0) or DEFAULT_PHASE_S
        plan = steps(o.steps if o else "")
        i = int(self.get_run_time() // phase)
        if i >= len(plan):
            return None
        return plan[i], 100.0  # spawn rate: the step happens within a second
