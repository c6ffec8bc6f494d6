"""The header lines of a small answer (its eight headers, as `tiergate serve` sends them),
built as `ConnectionWriter._head_bytes` built them before 3bcbd1a (a comprehension for the
names, one for the values, a loop appending four pieces a header) and after (map and join),
in process: 7 rounds, the order rotating, each the least of 5 repeats of 100,000 builds.

Usage: python docs/results/instructions-header-lines/head.py"""

import operator
import statistics
import timeit

EVERY = [
    (b"date", b"Mon, 07 Dec 2026 04:07:00 GMT"),
    (b"server", b"uvicorn"),
    (b"x-request-id", b"f8e87b6458114b5100000000"),
    (b"x-tiergate-tier", b"throughput"),
    (b"x-tiergate-backend", b"http://127.0.0.1:25222"),
    (b"x-tiergate-attempts", b"1"),
    (b"content-type", b"application/json"),
    (b"content-length", b"314"),
]
STATUS = b"HTTP/1.1 200 OK\r\n"
_NAME, _VALUE = operator.itemgetter(0), operator.itemgetter(1)
_HEADER = b": ".join


def before() -> bytes:
    names = [name.lower() for name, _ in EVERY]
    b"\t".join([v for _, v in EVERY])  # (the values' check reads them joined)
    out = [STATUS]
    for name, (_, value) in zip(names, EVERY, strict=True):
        if name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
            pass
        out += [name, b": ", value, b"\r\n"]
    out.append(b"\r\n")
    return b"".join(out)


def after() -> bytes:
    names = list(map(bytes.lower, map(_NAME, EVERY)))
    values = list(map(_VALUE, EVERY))
    b"\t".join(values)
    if b"connection" in names:
        pass
    lines = b"\r\n".join([*map(_HEADER, zip(names, values, strict=True)), b""])
    return b"".join([STATUS, lines, b"\r\n"])


assert before() == after()
ROUNDS, N = 7, 100_000
times: dict[str, list[float]] = {"before": [], "after": []}
for r in range(ROUNDS):
    order = [before, after] if r % 2 == 0 else [after, before]
    for f in order:
        times[f.__name__].append(min(timeit.repeat(f, number=N, repeat=5)) / N * 1e6)
for name, ts in times.items():
    each = " / ".join(f"{t:.2f}" for t in ts)
    print(f"{name}: median {statistics.median(ts):.2f} us a build "
          f"(rounds {each}; {ROUNDS} x 5 x {N:,} builds)")  # fmt: skip
ratios = [a / b for a, b in zip(times["after"], times["before"], strict=True)]
print(f"after / before: median {statistics.median(ratios):.3f}x "
      f"(rounds {' / '.join(f'{x:.3f}' for x in ratios)})")  # fmt: skip
