"""The acceptance at two speeds (change.diff applied) on counters of a stationary workload:
per seed, how far the workload's average (read by the model) and the running streams' (the
short sums, what the model read before) stand from the truth after 20 s, as root mean squares
over 70 s of scrapes; and a shift to a chain that accepts little, read 10 s later.

    git apply docs/results/acceptance-two-speeds-tried/change.diff
    python docs/results/acceptance-two-speeds-tried/scatter.py"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from gateway.backends.latency_model import AcceptanceRate

CHAIN = (0.45, 0.35, 0.3, 0.25, 0.2)  # `v4-low`'s: each position accepted after the one before
LOW = (0.2, 0.1, 0.1, 0.1, 0.1)


def mean(chain: tuple[float, ...]) -> float:
    return 1 + sum(math.prod(chain[: i + 1]) for i in range(len(chain)))


def accepted(rng: random.Random, n: int, chain: tuple[float, ...]) -> int:
    out = 0
    for _ in range(n):
        for p in chain:
            if rng.random() >= p:
                break
            out += 1
    return out


def main() -> None:
    truth = mean(CHAIN)
    for seed in range(5):
        rng, acc = random.Random(seed), AcceptanceRate(halflife_s=3.0)
        drafts = acc_tokens = 0
        t = 0.0
        acc.observe((0, 0, 0), t)
        off_long, off_short = [], []
        for i in range(360):  # 4 streams at ~50 steps a second, scraped every 0.25 s
            t += 0.25
            drafts, acc_tokens = drafts + 50, acc_tokens + accepted(rng, 50, CHAIN)
            acc.observe((drafts, drafts * 5, acc_tokens), t)
            if i >= 80 and acc.tokens_per_step is not None:
                off_long.append(acc.tokens_per_step / truth - 1)
                off_short.append((1 + acc.accepted / acc.drafts) / truth - 1)
        for _ in range(40):
            t += 0.25
            drafts, acc_tokens = drafts + 50, acc_tokens + accepted(rng, 50, LOW)
            acc.observe((drafts, drafts * 5, acc_tokens), t)
        rms_long = math.sqrt(sum(x * x for x in off_long) / len(off_long))
        rms_short = math.sqrt(sum(x * x for x in off_short) / len(off_short))
        after = (acc.tokens_per_step or 0) / mean(LOW) - 1
        short = (1 + acc.accepted / acc.drafts) / mean(LOW) - 1
        print(f"seed {seed}: off the truth, rms, workload's {rms_long:.4f}, running streams' "
              f"{rms_short:.4f}; 10 s after a shift to {mean(LOW):.3f}: workload's {after:+.3f},"
              f" running streams' {short:+.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
