"""`tiergate bench chaos` end to end with seconds-long scenarios, against real processes: the
report is complete and consistent with itself, the healthy run counts every stream as whole,
the crash is seen, the gateway restart is measured, and no process outlives the bench, Ctrl-C
included. Nothing here judges the gateway's resilience: the full run does that."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.chaos import RESTART_STREAMS, Options, run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SCENARIOS = ("healthy", "crash", "gateway-restart")


def _children(pid: int) -> set[int]:
    """Live processes whose parent is `pid` (Linux /proc)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_chaos_report_is_complete_and_consistent(tmp_path: Path) -> None:
    before = _children(os.getpid())
    opts = Options(scenarios=SCENARIOS, seconds=3, users=12, max_tokens=512, out=tmp_path,
                   logs=tmp_path / "logs", readmit_wait_s=2,
                   command="tiergate bench chaos (smoke)")  # fmt: skip
    console = Console(file=io.StringIO(), width=200)
    results = run(opts, console)

    assert _children(os.getpid()) == before  # every simulator, gateway and Redis is gone
    assert [r.scenario for r in results] == list(SCENARIOS)
    for r in results:
        assert r.sent > 0
        assert r.sent == r.ok + r.failed + r.cut
        assert r.max_silence_s is not None
    healthy, crash, restart = results
    # A healthy deployment's streams are whole by the bench's definition: the checker agrees
    # with what the gateway sends (tokens, one id, usage, [DONE]).
    assert (healthy.ok, healthy.failed, healthy.cut) == (healthy.sent, 0, 0), healthy.why
    assert healthy.attempts_per_request is not None
    assert 0.8 <= healthy.attempts_per_request <= 1.2
    assert healthy.ttft_p99_s is not None
    assert healthy.ttft_n > 0
    # The killed simulator shows as ejected in /state, and comes back on its port.
    assert crash.eject_s is not None
    assert crash.eject_s < 5
    assert crash.extra["restart_ready_s"] > 0
    assert crash.ejections >= 1
    assert restart.users == RESTART_STREAMS
    assert restart.extra["in_flight_at_signal"] > 0
    assert restart.extra["exit_status"] is not None
    assert restart.extra["signal_to_ready_s"] > restart.extra["signal_to_exit_s"]

    report = json.loads((tmp_path / "chaos.json").read_text())
    assert [r["scenario"] for r in report["results"]] == list(SCENARIOS)
    assert report["revision"]["commit"]
    lines = [v["line"] for v in report["verdicts"]]
    assert any("silent" in line for line in lines)
    assert any("gateway restart" in line for line in lines)
    md = (tmp_path / "chaos.md").read_text()
    assert "Command: `tiergate bench chaos (smoke)`" in md
    for name in SCENARIOS:
        assert f"| {name} | " in md
        assert f"### {name}" in md
    assert (tmp_path / "chaos.png").stat().st_size > 10_000
    assert (tmp_path / "logs" / "crash" / "gateway-0.log").exists()
    assert (tmp_path / "logs" / "gateway-restart" / "gateway-1.log").exists()


def _foreground() -> None:
    """In the child: Ctrl-C's default action, as in a terminal's foreground job. Run from a
    background job, the tests inherit SIGINT ignored, and so would the bench (Python keeps an
    ignored SIGINT ignored), which would then run its whole 30 s and leave its processes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    bench = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "bench", "chaos", "--scenario", "healthy",
         "--seconds", "30", "--users", "4", "--out", str(tmp_path), "--logs", str(logs)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_foreground,
    )  # fmt: skip
    try:
        log = logs / "healthy" / "gateway-0.log"
        deadline = time.monotonic() + 40
        while not (log.exists() and "gateway ready" in log.read_text()):
            assert bench.poll() is None, bench.stderr.read() if bench.stderr else ""
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # load running
        started = _children(bench.pid)
        assert len(started) == 4  # three simulators and the gateway
        bench.send_signal(signal.SIGINT)
        bench.wait(30)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert not [pid for pid in started if _alive(pid)]
    assert not (tmp_path / "chaos.json").exists()  # nothing reported for a run cut short
