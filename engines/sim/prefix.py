"""Automatic prefix caching, as vLLM (V1) does it, reduced to what changes timing and metrics.

A prompt is cut into blocks of `block_size` tokens; each full block is named by a hash chained
over every token up to and including it (block i's hash covers block i-1's hash and its own
tokens), so two prompts share cached blocks only as far as they share a prefix. A request reuses
its longest run of leading blocks found in the cache and prefills the rest; once prefilled, its
full blocks join the cache, and so does each block of its output once computed: a chat's next
turn, which sends the reply back, reuses it too.

Blocks a running request holds are referenced and never evicted. Unreferenced cached blocks sit
in the free part of the KV pool: they are reused on a hit, and evicted least recently used first
when the pool needs their room (the scheduler bounds them by its free block count). As in vLLM, a
request's blocks are released last block first, so a prompt's tail is evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


def block_hashes(tokens: Sequence[str | int], block_size: int) -> tuple[int, ...]:
    """The chained hash of each full block of `tokens` (a partial last block has none)."""
    out: list[int] = []
    parent: int | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return tuple(out)


class PrefixCache:
    """Cached block hashes: referenced ones with their reference counts, unreferenced ones in
    LRU order (oldest first). Capacity is the caller's: `evict_to(n)` keeps at most n of the
    unreferenced."""

    def __init__(self) -> None:
        self._refs: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._refs) + len(self._free)

    def __contains__(self, block: int) -> bool:
        return block in self._refs or block in self._free

    @property
    def unreferenced(self) -> int:
        return len(self._free)

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks of `hashes` (at most `limit`) are cached."""
        n = 0
        for h in hashes[:limit]:
            if h not in self._refs and h not in self._free:
                break
            n += 1
        return n

    def acquire(self, hashes: Iterable[int]) -> None:
        """Reference these blocks (cached ones are reused, others join the cache)."""
        refs, free = self._refs, self._free
        for h in hashes:
            if h in free:
                del free[h]
            refs[h] = refs.get(h, 0) + 1

    def release(self, hashes: Sequence[int]) -> None:
        """Drop one reference to each; those left unreferenced become the most recently used,
        the first block last (so it is the last of them to be evicted)."""
        refs, free = self._refs, self._free
        for h in reversed(hashes):
            left = refs[h] - 1
            if left:
                refs[h] = left
            else:
                del refs[h]
                free[h] = None

    def evict_to(self, capacity: int) -> int:
        """Evict least recently used unreferenced blocks until at most `capacity` remain;
        returns how many were evicted."""
        n = max(0, len(self._free) - max(0, capacity))
        for _ in range(n):
            self._free.popitem(last=False)
        return n
