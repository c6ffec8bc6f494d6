"""Bursty load: 8 users with spikes to 64, e.g. 20 s at 8 then 10 s at 64, repeated.

    locust -f loadtests/locust/scenarios/burst.py --headless -H http://127.0.0.1:8000 \
        --phase-seconds 20 --spike-seconds 10 --bursts 3

--phase-seconds is the base phase (default 20), --spike-seconds the spike (default half the
base phase), --bursts how many base+spike cycles (default 3); the run ends with a base phase.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from locust import LoadTestShape, events

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # where locustfile.py is
from locustfile import LLMUser  # noqa: F401  (the user class Locust runs)

BASE_USERS, SPIKE_USERS = 8, 64
DEFAULT_PHASE_S = 20.0


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    parser.add_argument("--spike-seconds", type=float, default=0.0, help="spike length (phase / 2)")
    parser.add_argument("--bursts", type=int, default=3, help="base + spike cycles (3)")


class BurstShape(LoadTestShape):
    def tick(self) -> tuple[int, float] | None:
        o: Any = self.runner.environment.parsed_options if self.runner else None
        base = (o.phase_seconds if o else 0.0) or DEFAULT_PHASE_S
        spike = (o.spike_seconds if o else 0.0) or base / 2
        bursts = o.bursts if o else 3
        t = self.get_run_time()
        cycle, into = divmod(t, base + spike)
        if cycle > bursts or (cycle == bursts and into >= base):
            return None  # `bursts` cycles, then one last base phase
        return (BASE_USERS if into < base else SPIKE_USERS), 100.0
