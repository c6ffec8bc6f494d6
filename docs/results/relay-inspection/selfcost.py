"""Each function's own instructions (callgrind's self cost) in two profiles, and what differs,
per request: `python selfcost.py A.out.1 B.out.1 [REQUESTS]`."""

from __future__ import annotations

import collections
import re
import sys


class Names:
    """A callgrind dump's function names: "(id) name" defines a compressed name, "(id)" uses
    it; read in the order the dump gives them."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}

    def __call__(self, spec: str) -> str:
        m = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if m is None:
            return spec
        if m.group(2):
            self.known[m.group(1)] = m.group(2)
        return self.known.get(m.group(1), spec)


def selfcost(path: str) -> collections.Counter[str]:
    name = Names()
    cost: collections.Counter[str] = collections.Counter()
    fn, call = "", False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                fn, call = name(line[3:].strip()), False
            elif line.startswith("cfn="):
                name(line[4:].strip())
            elif line.startswith("calls="):
                call = True  # the next cost line is the call's inclusive cost: not this fn's
            elif line[:1].isdigit() or line[:1] in "+-*":
                if call:
                    call = False
                elif fn and len(parts := line.split()) >= 2:
                    cost[fn] += int(parts[1])
    return cost


def main(a: str, b: str, requests: int) -> None:
    ca, cb = selfcost(a), selfcost(b)
    ta, tb = sum(ca.values()), sum(cb.values())
    print(f"per request: {ta / requests:,.0f} against {tb / requests:,.0f} "
          f"({(ta - tb) / requests:+,.0f}, {100 * (ta - tb) / ta:.1f}% of the first)")  # fmt: skip
    diff = {k: (ca[k] - cb[k]) / requests for k in ca.keys() | cb.keys()}
    for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:15]:
        print(f"{v:+10,.0f}  {k[:90]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 200)
