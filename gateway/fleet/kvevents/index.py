"""What one engine holds in its KV cache, learned from its events: the gateway's own block keys
(gateway.policy.blockkeys, chained from the token ids each BlockStored carries), and the engine's
hash of each block mapped to our key so that BlockRemoved and a later block's parent resolve."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.kvevents.decode import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, EventBatch
from gateway.policy.blockkeys import BYTES_PER_TOKEN, chain_keys, next_key, root_key

INDEXED_MEDIA = frozenset({None, "GPU"})
"""The device tier only: blocks an offloading connector moved to CPU or storage are slower to load
back and are reported again as stored when they return."""
INDEXED_KINDS = frozenset({None, "full_attention"})
"""A hybrid model publishes every group's blocks; the full-attention group holds the whole prefix."""


class EngineIndex:
    """One engine's cached blocks by our key. Not thread-safe: one subscriber task owns it."""

    def __init__(self) -> None:
        self._by_hash: dict[BlockHash, int] = {}
        self._keys: dict[int, int] = {}
        """our key -> how many of the engine's blocks have it (a block stored twice, in two groups)"""
        self.block_size: int | None = None
        """The block size of the latest BlockStored; None until one arrives."""
        self.unchained = 0
        """Blocks skipped because their parent was never seen (stored before we subscribed)."""

    def __len__(self) -> int:
        return len(self._keys)

    def apply(self, batch: EventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                self._remove(event)
            elif isinstance(event, AllBlocksCleared):
                self.clear()

    def clear(self) -> None:
        self._by_hash.clear()
        self._keys.clear()

    def match(self, keys: Sequence[int]) -> int:
        """How many leading blocks of a prompt (its keys, from blockkeys.chain_keys) are cached."""
        held = self._keys
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def holds(self, key: int) -> bool:
        return key in self._keys

    def match_tokens(self, tokens: Sequence[int], lora_name: str | None = None, cache_salt: str | None = None) -> int:
        """match() for a prompt's token ids, at this engine's block size; 0 before any event. The
        last token never counts: engines compute at least one token of every prompt (vLLM's and
        SGLang's hit is at most the prompt's length less one)."""
        if self.block_size is None:
            return 0
        return self.match(chain_keys(tokens[:-1], self.block_size, lora_name, cache_salt))

    def _store(self, event: BlockStored) -> None:
        if event.medium not in INDEXED_MEDIA or event.kind not in INDEXED_KINDS:
            return
        hashes = event.block_hashes
        if not hashes:
            return
        size = event.block_size
        count = len(event.tokens) // BYTES_PER_TOKEN
        if count != size * len(hashes):
            # An engine whose pages are not the block size it reports: the tokens split evenly.
            size = count // len(hashes)
            if size < 1:
                return
        self.block_size = size
        extras = event.extra_keys or ()
        if event.parent_block_hash is None:
            salt = event.cache_salt or _salt(extras[0] if extras else None, event.lora_name)
            key = root_key(size, event.lora_name, salt)
        else:
            found = self._by_hash.get(event.parent_block_hash)
            if found is None:
                self.unchained += len(hashes)
                return
            key = found
        tokens, step = event.tokens, size * BYTES_PER_TOKEN
        by_hash, held = self._by_hash, self._keys  # locals: this loop runs for every block stored
        for i, engine_hash in enumerate(hashes):
            block = tokens[i * step : (i + 1) * step]
            if i < len(extras):
                extra = _opaque(extras[i], event.lora_name, i == 0 and event.parent_block_hash is None)
                key = next_key(key, block, extra)
            else:
                key = hash((key, block))  # next_key without extra, inlined
            old = by_hash.get(engine_hash)
            if old == key:
                continue  # a re-report of a block already held (vLLM reports prefix-cache reuse)
            if old is not None:
                self._release(old)
            by_hash[engine_hash] = key
            held[key] = held.get(key, 0) + 1

    def _remove(self, event: BlockRemoved) -> None:
        if event.medium not in INDEXED_MEDIA:
            return
        by_hash, held = self._by_hash, self._keys
        for engine_hash in event.block_hashes:
            key = by_hash.pop(engine_hash, None)
            if key is None:
                continue
            left = held.get(key, 0) - 1  # _release, inlined
            if left > 0:
                held[key] = left
            else:
                held.pop(key, None)

    def _release(self, key: int) -> None:
        left = self._keys.get(key, 0) - 1
        if left > 0:
            self._keys[key] = left
        else:
            self._keys.pop(key, None)


def _own(entries: tuple[object, ...] | None, lora_name: str | None) -> list[object]:
    """A block's vLLM extra keys without the LoRA name, which the key's root already holds."""
    rest = list(entries or ())
    if lora_name is not None and rest and rest[0] == lora_name:
        rest.pop(0)
    return rest


def _salt(entries: object, lora_name: str | None) -> str | None:
    """vLLM puts a request's cache_salt, untagged, among the first block's extra keys: the only
    string there once the LoRA name is removed (images are pairs, prompt embeddings bytes)."""
    if not isinstance(entries, tuple):
        return None
    found = [e for e in _own(entries, lora_name) if isinstance(e, str)]
    return found[0] if len(found) == 1 else None


def _opaque(entries: object, lora_name: str | None, first: bool) -> bytes:
    """Whatever else the engine hashed into a block, as bytes mixed into its key."""
    if not isinstance(entries, tuple):
        return b""
    rest = _own(entries, lora_name)
    if first:
        rest = [e for e in rest if not isinstance(e, str)]
    return repr(rest).encode() if rest else b""
