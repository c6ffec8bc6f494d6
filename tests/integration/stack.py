"""Tests use the same deployment helper as the benchmarks, and wait for states by polling."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from loadtests.harness.stack import MODEL, Stack, add_gateway, config, start_stack

__all__ = ["MODEL", "Stack", "add_gateway", "affinity_outcomes", "config", "gc_collected",
           "start_stack", "wait_until", "wait_until_async"]  # fmt: skip

T = TypeVar("T")
WAIT_S = 20.0  # generous: the machine may be busy
POLL_S = 0.05


def wait_until(
    check: Callable[[], T], what: str, timeout_s: float = WAIT_S, every: float = POLL_S
) -> T:
    """Call `check` every `every` s until it returns something truthy, and return that; fail
    naming `what` (the state waited for) if it has not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what} (last: {value!r})")
        time.sleep(every)
    return value


async def wait_until_async(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """`wait_until` for a test's event loop, which goes on running meanwhile; `check` may be
    a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what} (last: {value!r})")
        await asyncio.sleep(POLL_S)


def affinity_outcomes(gateway_url: str) -> Counter[str]:
    """The gateway's count of what prefix affinity did, by outcome and the tier the request
    went to first ("home throughput")."""
    out: Counter[str] = Counter()
    for line in httpx.get(gateway_url + "/metrics").text.splitlines():
        if line.startswith("tiergate_affinity_decisions_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            tier = line.split('tier="', 1)[1].split('"', 1)[0]
            out[f"{outcome} {tier}"] += int(float(line.rsplit(" ", 1)[1]))
    return out


def gc_collected(gateway_url: str) -> float:
    """Objects the gateway's cycle collector has found so far, all generations (its own
    /metrics); fails where the page has no such series."""
    page = httpx.get(gateway_url + "/metrics").text
    found = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
             if line.startswith("python_gc_objects_collected_total{")]  # fmt: skip
    assert found, "no python_gc_objects_collected_total on /metrics"
    return sum(found)
