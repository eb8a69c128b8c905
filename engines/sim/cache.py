"""The simulator's prefix cache: chained block hashes of a prompt, and an LRU set of cached blocks whose
running sequences' blocks are pinned."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks: block i's hash covers every token before it too."""
    out: list[int] = []
    prev = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        # Hashes of int tuples are not randomised per process, so they are stable across runs.
        prev = hash((prev, tuple(token_ids[start : start + block_size])))
        out.append(prev)
    return tuple(out)


class PrefixCache:
    """LRU set of cached prompt blocks. Blocks of running sequences are pinned and never evicted."""

    def __init__(self) -> None:
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._pins: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` are cached."""
        for i, h in enumerate(hashes):
            if h not in self._lru:
                return i
        return len(hashes)

    def pin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            self._lru[h] = None
            self._lru.move_to_end(h)
            self._pins[h] = self._pins.get(h, 0) + 1

    def unpin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            left = self._pins.get(h, 0) - 1
            if left > 0:
                self._pins[h] = left
            else:
                self._pins.pop(h, None)

    def trim(self, max_unpinned: int) -> None:
        """Evict least recently used unpinned blocks until at most ``max_unpinned`` remain."""
        excess = len(self._lru) - len(self._pins) - max(max_unpinned, 0)
        if excess <= 0:
            return
        victims = list(itertools.islice((h for h in self._lru if h not in self._pins), excess))
        for h in victims:
            del self._lru[h]

    def clear(self) -> None:
        """Forget unpinned blocks (pinned ones belong to running sequences and stay)."""
        self.trim(0)
