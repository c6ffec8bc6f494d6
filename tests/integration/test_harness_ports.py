"""The harness's ports: drawn again when another process binds one first, and never drawn
twice (a port drawn for a server that starts later stays claimed)."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtests.harness import procs
from loadtests.harness.procs import SimProcess, free_port, free_ports


@pytest.fixture
def held() -> Iterator[int]:
    """A port another process's socket listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_drawn_port_taken_before_the_bind_is_drawn_again(
    held: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws = iter([held, free_port()])
    monkeypatch.setattr(procs, "free_port", lambda host="127.0.0.1": next(draws))
    with SimProcess(profile="v3", args=["--speedup", "10"], log=tmp_path / "sim.log") as sim:
        assert sim.port != held
        assert httpx.get(sim.url + "/health").status_code == 200
    assert "already in use" in (tmp_path / "sim.log").read_text().lower()


def test_a_port_given_by_the_caller_is_never_changed(held: int, tmp_path: Path) -> None:
    sim = SimProcess(port=held, profile="v3", log=tmp_path / "sim.log")
    with pytest.raises(RuntimeError, match=f"127.0.0.1:{held} did not start"):
        sim.start()
    assert sim.port == held
    assert not sim.alive()


def _draws(monkeypatch: pytest.MonkeyPatch, *firsts: int) -> None:
    """The harness's random draws, `firsts` in this order."""
    seq = iter(firsts)
    monkeypatch.setattr(random, "randrange", lambda *_: next(seq))


def test_a_port_drawn_once_is_not_drawn_again_until_its_claim_is_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn, other = free_port(), free_port()  # bindable all along: nobody binds them here
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unclaimed = s.getsockname()[1]  # free once closed; never drawn by the harness
    _draws(monkeypatch, drawn, other, unclaimed)
    assert free_ports() == unclaimed
    claim = procs._CLAIMS / str(drawn)
    stale = time.time() - procs._CLAIM_S - 1
    os.utime(claim, (stale, stale))
    _draws(monkeypatch, drawn)
    assert free_ports() == drawn
    assert time.time() - claim.stat().st_mtime < 60  # claimed afresh
