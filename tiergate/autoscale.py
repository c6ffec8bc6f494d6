"""`tiergate up --autoscale`: the throughput pool's simulators started and stopped to follow the
gateway's planner, on one machine, as an autoscaler would in a cluster.

The pool is a file the gateway discovers its backends from (gateway.backends.discovery.file).
Every `interval_s` the scaler reads the plan in the gateway's /state:
- more replicas wanted than are serving or starting: new simulators start at once (each takes
  `tiergate sim --startup-s` to open its port, as vLLM loads its weights) and join the file
  once they answer;
- fewer wanted, for `down_after_s` on end (an HPA's scale-down stabilisation): the newest
  serving one leaves the file, the gateway sends it nothing new and forgets it once its last
  stream has ended, and only then is its process stopped. So no request is failed or cut by a
  scale-down.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtests.harness.procs import SimProcess

__all__ = ["PoolScaler"]

log = logging.getLogger("tiergate.autoscale")


@dataclass
class _Replica:
    sim: SimProcess
    started: concurrent.futures.Future[SimProcess] | None = None  # None: serving already
    leaving: bool = False


@dataclass
class PoolScaler:
    gateway: str  # the gateway's base URL
    tier: str  # the tier's name in the plan
    listing: Path  # the file the tier discovers its backends from
    spawn: Callable[[], SimProcess]  # a new simulator, not started yet
    startup_s: float  # how long a simulator takes to open its port
    interval_s: float = 2.0
    down_after_s: float = 30.0
    replicas: list[_Replica] = field(default_factory=list)
    _pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(8, "sim-start")
    )
    _fewer_since: float | None = None

    def adopt(self, sim: SimProcess) -> None:
        """A simulator started before the scaler, already in the file."""
        self.replicas.append(_Replica(sim))

    def serving(self) -> list[_Replica]:
        return [r for r in self.replicas if r.started is None and not r.leaving]

    def write(self) -> None:
        """The serving simulators' URLs, written whole and renamed over the file."""
        new = self.listing.with_suffix(".new")
        new.write_text(yaml.safe_dump(sorted(r.sim.url for r in self.serving())))
        new.replace(self.listing)

    def state(self) -> dict[str, Any] | None:
        try:
            value: dict[str, Any] = httpx.get(self.gateway + "/state", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None  # not up yet, or going down: next round
        return value

    def step(self, now: float) -> None:
        state = self.state()
        if state is None or state.get("plan") is None:
            return
        known = {b["url"] for b in state["backends"]}
        changed = False
        for r in list(self.replicas):
            if r.started is not None and r.started.done():
                if r.started.exception() is None:
                    r.started = None
                    changed = True
                    log.info("%s: %s serving", self.tier, r.sim.url)
                else:
                    log.warning("%s: %s did not start: %s", self.tier, r.sim.url,
                                r.started.exception())  # fmt: skip
                    self.replicas.remove(r)
            elif r.leaving and r.sim.url not in known:  # forgotten: no stream left on it
                r.sim.stop()
                self.replicas.remove(r)
                log.info("%s: %s stopped", self.tier, r.sim.url)
        if changed:
            self.write()
        (desired,) = [t["desired"] for t in state["plan"]["tiers"] if t["name"] == self.tier]
        serving = self.serving()
        starting = [r for r in self.replicas if r.started is not None]
        have = len(serving) + len(starting)
        if desired > have:
            self._fewer_since = None
            for _ in range(desired - have):
                sim = self.spawn()
                timeout = self.startup_s + 30
                self.replicas.append(_Replica(sim, self._pool.submit(sim.start, timeout)))
                log.info("%s: desired %d, starting %s", self.tier, desired, sim.url)
        elif desired < len(serving) and not starting:
            if self._fewer_since is None:
                self._fewer_since = now
            if now - self._fewer_since >= self.down_after_s:
                serving[-1].leaving = True
                self._fewer_since = None
                self.write()
                log.info("%s: desired %d, %s leaving", self.tier, desired, serving[-1].sim.url)
        else:
            self._fewer_since = None

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.step(time.monotonic())
            except Exception:  # the scaler must outlive one bad round
                log.exception("%s: scaling round failed", self.tier)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for r in self.replicas:
            r.sim.stop()
