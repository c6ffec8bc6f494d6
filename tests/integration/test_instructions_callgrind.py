"""The instruction-count benchmark's use of callgrind, on a real callgrind run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtests.instructions import callgrind_prefix, instructions, valgrind, zero

WORKER = """
import sys
for line in sys.stdin:
    sum(range(int(line)))
    print("done", flush=True)
"""


@pytest.mark.skipif(valgrind() is None, reason="valgrind is not installed")
def test_counting_a_window_of_requests_under_callgrind(tmp_path: Path) -> None:
    """Zeroed counters, then twice as much work, counts about twice as many instructions."""
    proc = subprocess.Popen([*callgrind_prefix(tmp_path / "cg.out"),
                             sys.executable, "-c", WORKER],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    stdin, stdout = proc.stdin, proc.stdout
    if stdin is None or stdout is None:
        raise AssertionError("pipes were asked for")

    def work(times: int) -> int:
        zero(proc.pid)
        for _ in range(times):
            stdin.write("20000\n")
            stdin.flush()
            assert stdout.readline() == "done\n"
        return instructions(proc.pid)

    try:
        deadline = time.monotonic() + 120
        while True:  # callgrind answers once the interpreter is up
            try:
                work(1)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        ten, twenty = work(10), work(20)
        assert ten > 10 * 20000  # at least an instruction per loop step
        assert 1.9 < twenty / ten < 2.1
    finally:
        proc.kill()
        proc.wait()
