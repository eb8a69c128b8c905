"""The gateway's own KV block keys: chained hashes over token ids, one per full block. The index of an
engine's KV events and the match of a request compute them the same way, so neither needs the
engine's hash function or its seed. Pure.

A key is Python's own 64-bit hash (SipHash, seeded per process) of the parent's key and the block's
packed ids: 2.8 times faster than blake2b over a prompt (94 against 262 µs for 25,000 ids, 2-core
AMD EPYC, 2026-12-07), and an int is a cheaper dict key than bytes. Keys never leave the process:
every gateway replica indexes the engines' events and matches its requests with its own seed, and
replicas agree on the matched block counts, not on the keys. A collision (about 2^-64 a pair of
blocks) would count a block as cached that is not: a routing choice, never a wrong answer."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import lru_cache

TOKEN_TYPE = "I"
"""Token ids as unsigned 32-bit integers: every vocabulary in use fits, and packing is one C call."""
BYTES_PER_TOKEN = array(TOKEN_TYPE).itemsize


@lru_cache(maxsize=256)
def root_key(block_size: int, lora_name: str | None = None, cache_salt: str | None = None) -> int:
    """The chain's seed: blocks of different sizes, adapters or cache salts never share a key, as the
    engine never shares their KV."""
    return hash(("gw-kv-root", block_size, lora_name, cache_salt))


def packed(tokens: Sequence[int]) -> bytes:
    """Token ids as the bytes a block key hashes (4 a token). OverflowError for an id outside
    0..2^32-1, TypeError for one that is not an int."""
    if isinstance(tokens, array) and tokens.typecode == TOKEN_TYPE:
        return tokens.tobytes()
    return array(TOKEN_TYPE, tokens).tobytes()


def unpacked(data: bytes) -> array[int]:
    ids = array(TOKEN_TYPE)
    ids.frombytes(data)
    return ids


def next_key(parent: int, block: bytes, extra: bytes = b"") -> int:
    """The key of a block from its parent's key (or the root) and the block's own tokens, packed.
    `extra` names what else the engine hashed into the block (an image's identifier, prompt
    embeddings): a request matched by its text alone never produces it, so such a block never
    matches one."""
    return hash((parent, block, extra)) if extra else hash((parent, block))


def chain_keys(
    tokens: Sequence[int], block_size: int, lora_name: str | None = None, cache_salt: str | None = None
) -> list[int]:
    """The keys of every full block of a prompt, first block first (a partial last block has none:
    engines cache only full blocks)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if len(tokens) < block_size:
        return []
    key = root_key(block_size, lora_name, cache_salt)
    out: list[int] = []
    data = packed(tokens)
    step = block_size * BYTES_PER_TOKEN
    for start in range(0, len(data) - step + 1, step):
        key = hash((key, data[start : start + step]))  # next_key, inlined: the loop runs per block
        out.append(key)
    return out
