"""The block keys of recent prompts' token ids, so that a prompt matched again (an agent's request
retried, a conversation's earlier turn matched for its next one, every request of a conversation
whose ids the memo remembers) is not hashed again: a 25,000-token prompt is ~100 µs of hashing at
vLLM's 128-token blocks and milliseconds at SGLang's one-token pages.

Keyed by the ids' identity, not their value (comparing values would cost what hashing does): the
token memo (pipeline/token_memo.py) hands out the same array for a prompt until it forgets or
replaces it, and a weak reference tells a live array from a new one at a reused address. Ids that
cannot be weakly referenced (a list) are hashed every time."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from gateway.policy.blockkeys import chain_keys

MAX_KEYS: Final = 500_000
"""Block keys held in all (~20 MB): past it, the least recently used prompts' keys go."""


class ChainCache:
    """Not thread-safe: the event loop's thread alone matches prompts."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._entries: OrderedDict[tuple[int, int], tuple[weakref.ref[Sequence[int]], list[int]]] = OrderedDict()
        self._held = 0
        self.max_keys = max_keys

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held(self) -> int:
        return self._held

    def keys(self, ids: Sequence[int], size: int) -> list[int]:
        """chain_keys(ids[:-1], size): the keys of a prompt's full blocks, its last token left out
        (engines compute at least one token of every prompt)."""
        slot = (id(ids), size)
        found = self._entries.get(slot)
        if found is not None and found[0]() is ids:
            self._entries.move_to_end(slot)
            return found[1]
        keys = chain_keys(ids[:-1], size)
        try:
            ref = weakref.ref(ids)
        except TypeError:
            return keys
        if found is not None:
            self._drop(slot)
        self._entries[slot] = (ref, keys)
        self._held += len(keys)
        while self._held > self.max_keys and self._entries:
            self._drop(next(iter(self._entries)))
        return keys

    def _drop(self, slot: tuple[int, int]) -> None:
        _, keys = self._entries.pop(slot)
        self._held -= len(keys)
