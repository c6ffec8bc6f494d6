"""Open-loop Poisson arrivals at --rate requests per second (within the limits below).

    locust -f loadtests/locust/scenarios/poisson.py --headless -H http://127.0.0.1:8000 \
        --rate 4 --pool-users 64 -t 120s

How: Locust users are closed loops, so a pool of --pool-users users (default 64) is started and
each one sends requests at the arrival times of its own Poisson process of rate rate / pool (it
waits an exponential time between *scheduled* sends, not after each response: constant_pacing
with random gaps). The superposition of the pool's independent processes is a Poisson process of
rate --rate, as long as no user is still busy when its next arrival comes.

Limits: a busy user sends its late arrival as soon as its request finishes, so the realized
arrival process is Poisson only while the pool is large enough: a user is busy a share
rate * E2E / pool of the time (Little's law), keep it well below 1 (e.g. 4 req/s with 8 s E2E
needs pool >> 32). Late arrivals are counted and reported at the end; if there are many, raise
--pool-users. In distributed mode --rate is the total over all workers. --run-time ends the run
(default: until stopped).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import gevent
from locust import LoadTestShape, events

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # where locustfile.py is
import locustfile  # the module, not LLMUser: only PoissonUser is to run

LATE_S = 0.05  # an arrival sent later than this after its scheduled time counts as late


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per second, in total (1)")
    parser.add_argument("--pool-users", type=int, default=64, help="users sending them (64)")


class PoissonUser(locustfile.CompletionsUser):
    arrivals = 0  # counters for this process, shared by all users
    late = 0

    def on_start(self) -> None:
        super().on_start()
        o = self.environment.parsed_options
        self.mean_gap = max(o.pool_users, 1) / o.rate  # per user: rate / pool
        # memoryless: starting every user's process with one exponential gap keeps the
        # superposition Poisson from the first second
        self.next_at = time.perf_counter() + random.expovariate(1.0 / self.mean_gap)

    def wait_time(self) -> float:
        return 0.0  # the task itself sleeps until the next scheduled arrival

    def arrive(self) -> None:
        delay = self.next_at - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        elif -delay > LATE_S:
            PoissonUser.late += 1  # the previous request was still running
        PoissonUser.arrivals += 1
        self.next_at += random.expovariate(1.0 / self.mean_gap)  # scheduled, not after the reply
        self.send_one()

    tasks: ClassVar[list[Any]] = [arrive]


@events.test_start.add_listener
def _reset(environment: Any, **_: Any) -> None:
    PoissonUser.arrivals = PoissonUser.late = 0


@events.test_stop.add_listener
def _report(environment: Any, **_: Any) -> None:
    if PoissonUser.arrivals:
        share = PoissonUser.late / PoissonUser.arrivals
        msg = f"poisson: {PoissonUser.late} of {PoissonUser.arrivals} arrivals late ({share:.0%})"
        if share > 0.01:
            msg += ": the pool was too small for an open loop, raise --pool-users"
        print(msg, flush=True)


class PoissonShape(LoadTestShape):
    use_common_options = True  # read --run-time

    def tick(self) -> tuple[int, float, list[type[Any]]] | None:
        o: Any = self.runner.environment.parsed_options if self.runner else None
        if o and o.run_time and self.get_run_time() >= o.run_time:
            return None
        pool = (o.pool_users if o else 0) or 64
        return pool, float(pool), [PoissonUser]  # only PoissonUser, even if LLMUser is loaded
