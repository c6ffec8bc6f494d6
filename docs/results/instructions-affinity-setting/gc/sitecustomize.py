"""Counts the garbage collector's passes per generation and the time they take, in a process
that finds this folder first on its PYTHONPATH; SIGUSR2 writes the counts so far to
$GCPROBE_OUT.1, .2, ... (with the number of objects the collector tracks, frozen ones aside)."""

import gc
import json
import os
import signal
import time
from typing import Any

_COUNT = {0: 0, 1: 0, 2: 0}
_SECONDS = {0: 0.0, 1: 0.0, 2: 0.0}
_STATE = {"start": 0.0, "dumps": 0}


def _pass(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _STATE["start"] = time.perf_counter()
        return
    g = info["generation"]
    _COUNT[g] += 1
    _SECONDS[g] += time.perf_counter() - _STATE["start"]


def _dump(*_: object) -> None:
    out = os.environ.get("GCPROBE_OUT")
    if out:
        _STATE["dumps"] += 1
        with open(f"{out}.{_STATE['dumps']}", "w") as f:
            json.dump({"count": _COUNT, "seconds": _SECONDS, "objects": len(gc.get_objects()),
                       "thresholds": gc.get_threshold()}, f)  # fmt: skip


gc.callbacks.append(_pass)
signal.signal(signal.SIGUSR2, _dump)
