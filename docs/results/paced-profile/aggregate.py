"""py-spy's raw samples (FILE) summed per function: its own share of the samples (the leaf of
the stack) and its inclusive share, the N largest of the first.

Usage: python aggregate.py FILE [N]"""

import collections
import re
import sys

own: collections.Counter[str] = collections.Counter()
inclusive: collections.Counter[str] = collections.Counter()
total = 0
with open(sys.argv[1]) as f:
    for line in f:
        stack, _, count = line.rstrip().rpartition(" ")
        n = int(count)
        total += n
        frames = [re.sub(r" \(([^:]*/)?([^/:]+):\d+\)", r" (\2)", x) for x in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
print("total samples", total)
print("--- self")
for frame, n in own.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
    print(f"{100 * n / total:5.1f}% {frame}")
print("--- inclusive")
for frame, n in inclusive.most_common(60):
    print(f"{100 * n / total:5.1f}% {frame}")
