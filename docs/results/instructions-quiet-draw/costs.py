"""Instructions one call costs on this interpreter, counted by callgrind: the figures the request
path's changes after b989e01 rest on.

Each case runs its statement N and 11 x N times inside a function (local names, as the request
path reads them) in a fresh interpreter under callgrind; the difference of the two totals over
10 x N is the cost of one run of the statement, the interpreter's start and the setup cancelled
out. The routing modules from their sources (TIERGATE_COMPILED=0), as `bench instructions`
runs them.

    python docs/results/instructions-quiet-draw/costs.py [N]    (N: 3000 by default)
    python docs/results/instructions-quiet-draw/costs.py draw [N]

`draw`: the quiet draw two ways, random() compared with the chance in a `map` (the gateway's
since 6a03082) against draws made 1,024 at a time by a helper (43a02f3 to 6a03082): draw.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SETUP = f"""
import os, sys, random, asyncio
os.environ["TIERGATE_COMPILED"] = "0"
sys.path.insert(0, {str(ROOT)!r})
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping
import uvloop
from gateway.pipeline.homes import Homes
from gateway.pipeline.intake import _LATER_BODY, later_turn
from gateway.routing.types import Backend, BackendLoad, LoadSnapshot, Role, by_tier

@dataclass(frozen=True, slots=True)
class FrozenSnapshot:  # LoadSnapshot as it was at b989e01
    backends: tuple
    loads: Mapping = field(default_factory=lambda: MappingProxyType({{}}), hash=False)
    taken_at: float = 0.0
    curves: Mapping = field(default_factory=lambda: MappingProxyType({{}}), hash=False,
                            compare=False)
    by_url: dict = field(init=False, repr=False, compare=False)
    distinct: bool = field(default=False, compare=False)
    tiers: tuple = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        by_url = dict(self.loads)
        object.__setattr__(self, "by_url", by_url)
        object.__setattr__(self, "loads", MappingProxyType(by_url))
        if not self.tiers and self.backends:
            object.__setattr__(self, "tiers", by_tier(self.backends))

class Drawn:  # Homes' draw as it was at b989e01: a method
    def __init__(self) -> None:
        self._chance, self._draw = 1 / 16, random.Random(1).random

    def drawn(self) -> bool:
        return self._draw() < self._chance

backends = tuple(Backend(f"http://h{{i}}", "pool", Role.THROUGHPUT, frozenset({{"m"}}))
                 for i in range(2))
loads = {{b.url: BackendLoad(1, 0, 0.0, 0, True, False, (), (), None) for b in backends}}
tiers, curves = by_tier(backends), {{}}
homes = Homes(1024, 600.0, quiet=(1, 16), rng=random.Random(1))
ex = type("Ex", (), {{}})()
ex.affinity, ex.backend, ex.status, ex.home = 1, None, 200, None
homes.begin(ex)  # one new key: quiet from here on
assert not homes.everyone
old = Drawn()
data = {{"model": "m", "prompt": "hello", "max_tokens": 4}}
body = b'{{"model": "m", "prompt": "hello", "max_tokens": 4}}'
loop = uvloop.new_event_loop()
noop = lambda: None
"""
CASES = {
    "a load snapshot, frozen dataclass (b989e01)":
        "FrozenSnapshot(backends, loads, 1.0, curves, distinct=True, tiers=tiers)",
    "a load snapshot, slotted dataclass (now)":
        "LoadSnapshot(backends, loads, 1.0, curves, distinct=True, tiers=tiers)",
    "while quiet: the draw, a method (b989e01)": "old.drawn()",
    "while quiet: the draw, next() on `Homes.draw` (now)": "next(homes.draw)",
    "a short completion: `later_turn` asked (b989e01)": "later_turn(data, False)",
    "a short completion: its body's length checked (now)": "len(body) >= _LATER_BODY[False]",
    "uvloop: a timer armed and cancelled (uvicorn's keep-alive, per answer)":
        "loop.call_later(5.0, noop).cancel()",
    "uvloop: the loop's clock read (the sweep's deadline, per answer)": "loop.time() + 5.0",
    "nothing (the loop itself)": "pass",
}  # fmt: skip
DRAW_SETUP = """
import itertools, random
r = random.Random(1)
chance = 1 / 16
mapped = map(chance.__gt__, iter(r.random, 2.0))
def block(n):
    return [r.random() < chance for _ in range(n)]
blocks = itertools.chain.from_iterable(map(block, itertools.repeat(1024)))
"""
DRAW_CASES = {
    "next() on random() compared in a map (now)": "next(mapped)",
    "next() on draws made 1,024 at a time (43a02f3)": "next(blocks)",
    "nothing (the loop itself)": "pass",
}


def main() -> None:
    # The counting itself is instructions-request-path's (the statements run in a function).
    spec = importlib.util.spec_from_file_location(
        "costs", ROOT / "docs/results/instructions-request-path/costs.py")  # fmt: skip
    assert spec is not None
    assert spec.loader is not None
    costs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(costs)
    args = sys.argv[1:]
    draw = bool(args) and args[0] == "draw"
    args = args[1:] if draw else args
    n = int(args[0]) if args else 3000
    costs.table(*((DRAW_CASES, n, DRAW_SETUP) if draw else (CASES, n, SETUP)), local=True)


if __name__ == "__main__":
    main()
