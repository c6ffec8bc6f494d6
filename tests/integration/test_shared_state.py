"""The shared-memory in-flight store across real processes: what each worker acquires is in every
worker's counts, and `try_acquire` never lets two workers past a limit together."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from gateway.backends.state import SharedInflightStore, SharedTable

A, B = "http://a:1", "http://b:2"
LIMIT = 3
ROUNDS = 20_000
REFUSALS = 100  # rounds in which the other worker held slots: they did contend


@pytest.fixture
def table() -> Iterator[SharedTable]:
    t = SharedTable.create([A, B], workers=2)
    try:
        yield t
    finally:
        t.unlink()
    assert not os.path.exists(t.path)


def _acquire_then_release(table: SharedTable, conn: Connection) -> None:
    """Worker 1: take 3 on A and 1 on B, say so, wait, give them back, say so."""
    store = SharedInflightStore(table, 1)
    for url in (A, A, A, B):
        store.acquire(url)
    conn.send(dict(store.local_counts()))
    conn.recv()
    for url in (A, A, A, B):
        store.release(url)
    conn.send(dict(store.local_counts()))


def test_each_worker_sees_the_others_counts(table: SharedTable) -> None:
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    other = ctx.Process(target=_acquire_then_release, args=(table, there))
    other.start()
    try:
        store = SharedInflightStore(table, 0)
        store.acquire(A)
        assert here.poll(20), "the other worker did not answer"
        assert here.recv() == {A: 3, B: 1}
        assert dict(store.counts()) == {A: 4, B: 1}
        assert dict(store.local_counts()) == {A: 1}
        here.send("release")
        assert here.poll(20)
        assert here.recv() == {}
        assert dict(store.counts()) == {A: 1}
        store.release(A)
        store.release(A)  # one too many: ignored, never negative
        assert dict(store.counts()) == {}
    finally:
        other.join(20)
    assert other.exitcode == 0


def test_a_worker_row_is_zeroed_when_it_goes(table: SharedTable) -> None:
    gone = SharedInflightStore(table, 1)
    gone.acquire(A)
    store = SharedInflightStore(table, 0)
    assert store.counts() == {A: 1}
    table.clear(1)  # the parent, once that worker has exited
    assert store.counts() == {}
    gone.acquire(B)
    SharedInflightStore(table, 1)  # its replacement starts from zero too
    assert store.counts() == {}


def _hammer(table: SharedTable, worker: int, conn: Connection) -> None:
    """Take up to LIMIT slots of A greedily, check the column's sum after each, give them all
    back; again and again, until both workers have been refused REFUSALS times (each marks it
    with a slot of B) and have done ROUNDS rounds. Reports (highest sum seen, slots taken,
    refusals)."""
    store = SharedInflightStore(table, worker)
    conn.recv()  # both start together
    deadline = time.monotonic() + 60
    worst = taken = refused = rounds = 0
    done = False
    while store.counts().get(B, 0) < 2 and time.monotonic() < deadline:
        held = 0
        while held < LIMIT and store.try_acquire(A, LIMIT):
            held += 1
            worst = max(worst, store.counts().get(A, 0))
        taken += held
        refused += held < LIMIT
        for _ in range(held):
            store.release(A)
        rounds += 1
        if not done and rounds >= ROUNDS and refused >= REFUSALS:
            store.acquire(B)  # this one is done; both stop once the other is too
            done = True
    conn.send((worst, taken, refused))


def test_try_acquire_is_strict_across_processes(table: SharedTable) -> None:
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [
        ctx.Process(target=_hammer, args=(table, w, there)) for w, (_, there) in enumerate(pipes)
    ]
    for p in procs:
        p.start()
    try:
        for here, _ in pipes:
            here.send("go")
        results = []
        for here, _ in pipes:
            assert here.poll(120), "a hammering worker did not finish"
            results.append(here.recv())
    finally:
        for p in procs:
            p.join(20)
    assert [p.exitcode for p in procs] == [0, 0]
    assert max(worst for worst, _, _ in results) == LIMIT
    # Both took slots, and both were refused while the other held some: they did contend.
    assert all(taken > 0 and refused >= REFUSALS for _, taken, refused in results), results
    assert SharedInflightStore(table, 0).counts().get(A, 0) == 0  # every slot given back
