"""Fixed concurrency: C closed-loop users for the whole run (the tutorial's 1 / 16 / 32 / 64).

    locust -f loadtests/locust/scenarios/fixed.py --headless -H http://127.0.0.1:8000 -u 16 -t 60s

FixedShape reads Locust's own --users (default 1) and --run-time (default: until stopped) and
starts every user at once (--spawn-rate is ignored). Without the shape the same load is
`locust -f loadtests/locust/locustfile.py --headless -u 16 -r 16 -t 60s ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from locust import LoadTestShape

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # where locustfile.py is
from locustfile import LLMUser  # noqa: F401  (the user class Locust runs)


class FixedShape(LoadTestShape):
    use_common_options = True  # read --users and --run-time

    def tick(self) -> tuple[int, float] | None:
        o: Any = self.runner.environment.parsed_options if self.runner else None
        users = (o.num_users if o else None) or 1
        if o and o.run_time and self.get_run_time() >= o.run_time:
            return None
        return users, float(users)  # all at once (headless sets -r to 1 when it is not given)
