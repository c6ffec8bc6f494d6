"""A seconds-long run of `tiergate bench conversations` (one round, a few chats, engines ten
times faster): the report's shape and counts, and chats one at a time back on their instance
with the defaults, their history found in its cache. The share in a crowd is
tests/integration/test_conversations.py's to hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from loadtests.conversations import ARMS, DEFAULTS, OFF, PHASES, Options, run

pytestmark = pytest.mark.e2e


def test_a_short_run_counts_every_later_turn(tmp_path: Path) -> None:
    opts = Options(solo=2, crowd=4, turns=3, rounds=1, speedup=10,
                   out=tmp_path / "conversations.json", chart=False,
                   command="tiergate bench conversations (test)")  # fmt: skip
    report = run(opts, Console(width=200))
    arms = report["arms"]
    assert set(arms) == set(ARMS)
    for by in arms.values():
        assert set(by) == set(PHASES)
        assert by["solo"]["later_turns"] == 2 * 2
        assert by["crowd"]["later_turns"] == 4 * 2
        for phase, f in by.items():
            assert 0 <= f["at_home"] <= f["later_turns"]
            assert len(f["share_rounds"]) == 1
            # Every turn of the phase finished on some engine, by the engines' own count.
            chats = opts.solo if phase == "solo" else opts.crowd
            assert f["served_rounds"] == [chats * opts.turns]
            assert 0 <= f["within_slo_rounds"][0] <= f["served_rounds"][0]
            assert f["seconds_rounds"][0] > 0
    # One chat at a time with the defaults: every later turn at home, most of its prompt cached
    # there (the system prompt and the turns before it).
    solo = arms[DEFAULTS]["solo"]
    assert solo["at_home"] == solo["later_turns"]
    assert solo["cached_share_median"] > 0.5
    # ... each went home by the gateway's own count; affinity off asks it nothing.
    assert solo["affinity"] == {"home": solo["later_turns"]}
    assert solo["moves"] == {}
    assert all(not f["affinity"] and not f["moves"] for f in arms[OFF].values())
    # Every turn sent elsewhere than its home is counted with the tier it went to.
    for f in arms[DEFAULTS].values():
        assert sum(f["moves"].values()) == sum(n for o, n in f["affinity"].items()
                                               if o not in ("home", "session"))  # fmt: skip
        assert all(k.split(" -> ")[1] in ("latency", "throughput") for k in f["moves"])
    assert report["verdicts"][0]["result"] == "MET"  # the solo phase's goal
    assert json.loads((tmp_path / "conversations.json").read_text()) == report
    md = (tmp_path / "conversations.md").read_text()
    assert "## Each round's share at home" in md
    assert "## Each round as the engines saw it" in md
    assert "## What prefix affinity did with the requests that had a home" in md


def test_one_off_chats_before_the_phases_are_not_counted_in_them(tmp_path: Path) -> None:
    """`--warm`: one-off chats at once before the chats, served, and counted in no phase."""
    opts = Options(solo=1, crowd=2, warm=4, turns=2, rounds=1, speedup=10,
                   out=tmp_path / "conversations.json", chart=False,
                   command="tiergate bench conversations --warm 4 (test)")  # fmt: skip
    report = run(opts, Console(width=200))
    for by in report["arms"].values():
        assert by["solo"]["served_rounds"] == [1 * 2]
        assert by["crowd"]["served_rounds"] == [2 * 2]
    assert report["settings"]["warm"] == 4
    assert "4 one-off chats at once" in (tmp_path / "conversations.md").read_text()
