"""What burn/sitecustomize.py's loop of K iterations costs alone, warm (K from argv)."""

import sys
import time

K = int(sys.argv[1])


def burn() -> int:
    x = 0
    for i in range(K):
        x += i
    return x


for _ in range(3):
    t = time.process_time()
    for _ in range(2000):
        burn()
    print(f"{K} iterations: {1000 * (time.process_time() - t) / 2000:.4f} ms of CPU")
