"""The crossover benchmark's timed loop against a real simulator: a level measures at least one
request however short its time and however slowly its users start (a CI run at machine load had
measured none: every user's requests had ended before the last user started)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from loadtests.crossover import Engine, Options, first_model, level_stats, timed_loop, window
from loadtests.harness.client import Result
from loadtests.harness.procs import SimProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with SimProcess(profile="v3", args=["--speedup", "50"]) as s:
        yield s.url


@pytest.mark.parametrize("users", [1, 3, 8])
def test_a_level_whose_users_start_after_its_time_still_measures(sim: str, users: int) -> None:
    # Requests of a few ms, users started 0.4 s apart, no time at all: with two requests each,
    # the first users would have finished before the last one started.
    opts = Options(latency=sim, throughput=sim, output_tokens=8, seconds=0.0)
    engine = Engine("throughput", sim, first_model(sim, {}))
    done: list[Result] = []
    results = asyncio.run(timed_loop(engine, users, opts, 0.4 * users, done.append))

    assert len(done) == len(results)
    assert all(r.ok for r in results)
    w = window(results)
    assert w is not None
    assert w.span > 0
    stats = level_stats("throughput", users, 0, results, opts.output_tokens)
    assert stats.n >= 1
    assert stats.errors == 0
    assert stats.short == 0
    assert stats.tpot_p50_ms > 0
    # Each user stopped once it had one request sent after every user had started and one
    # ended after every first request had.
    for u in range(users):
        mine = [r for r in results if r.user == u]
        assert len(mine) >= 2
        assert any(r.sent >= w.all_sent and r.index > 1 for r in mine)
        assert any(r.sent + (r.e2e or 0.0) > w.start for r in mine)
