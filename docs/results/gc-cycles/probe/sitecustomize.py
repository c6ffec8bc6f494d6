"""Loaded by every Python process started with this folder on PYTHONPATH: in the gateway
(`tiergate serve`), what the cycle collector did, written at exit to `$GCPROBE_OUT.<pid>`: the
collections and the seconds spent in them by generation, the objects they found, and the
process's CPU seconds; with `GCPROBE_SAVE=1` also the types of what it found, kept for the
count (gc.DEBUG_SAVEALL) instead of freed."""

import atexit
import collections
import gc
import os
import sys
import time

if "serve" in sys.argv and os.environ.get("GCPROBE_OUT"):
    _out = f"{os.environ['GCPROBE_OUT']}.{os.getpid()}"
    _runs = [0, 0, 0]
    _seconds = [0.0, 0.0, 0.0]
    _found = [0, 0, 0]
    _began = [0.0]

    def _timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _began[0] = time.perf_counter()
            return
        gen = info["generation"]
        _runs[gen] += 1
        _seconds[gen] += time.perf_counter() - _began[0]
        _found[gen] += info["collected"]

    gc.callbacks.append(_timed)
    if os.environ.get("GCPROBE_SAVE"):
        gc.set_debug(gc.DEBUG_SAVEALL)

    def _write() -> None:
        lines = [
            f"collections by generation: {_runs}",
            f"seconds in them: {[round(s, 4) for s in _seconds]} (all {sum(_seconds):.4f})",
            f"objects found: {_found}",
            f"process CPU seconds: {time.process_time():.3f}",
        ]
        if gc.garbage:
            kinds = collections.Counter(
                f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
            )
            lines += ["found, by type:"] + [f"  {n}\t{k}" for k, n in kinds.most_common(12)]
        with open(_out, "w") as f:
            f.write("\n".join(lines) + "\n")

    atexit.register(_write)
