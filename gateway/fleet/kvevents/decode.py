"""Decode the msgpack `EventBatch` that vLLM and SGLang publish on their KV-event socket into
BlockStored / BlockRemoved / AllBlocksCleared values. Both engines encode the batch as an array
(`[ts, events, dp_rank]`) and each event as a msgspec tagged struct: a map with a `type` key
(vLLM >= 0.11, SGLang 0.5) or, from older releases, an array whose first item is the tag. Block
hashes are ints or bytes. Unknown event types and fields are skipped: both engines add fields.

Decoded with msgspec, the library both engines encode with. A batch in the shape they publish today
(an array batch of map-shaped events of the three known types, every field of its declared type) is
decoded straight into typed structs (wire.py), in C: one request's batch (a block of 128 ids
stored, one removed) is decoded and indexed in three quarters of the generic path's time
(docs/routing.md has the command and the figures). Anything else (array-shaped events, a
map batch, an unknown event type, a field of another type) takes the generic path, which accepts
what it can and names what it cannot."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from gateway.fleet.kvevents.wire import WireBatch, WireRemoved, WireStored
from gateway.policy.blockkeys import TOKEN_TYPE, unpacked
from gateway.value import value

BlockHash = int | bytes
"""An engine's own block hash: only compared, never recomputed."""

# The positional fields of the array-shaped structs, after the tag, in each engine's declared order
# (vllm/distributed/kv_events.py, sglang/srt/disaggregation/kv_events.py).
STORED_FIELDS: dict[str, tuple[str, ...]] = {
    "vllm": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
    ),
    "sglang": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "cache_salt"),
}
REMOVED_FIELDS = ("block_hashes", "medium")


class EventDecodeError(ValueError):
    """A payload that is not an EventBatch."""


@value
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    tokens: bytes
    """The blocks' token ids, packed as blockkeys.TOKEN_TYPE (blockkeys.packed): what the block keys
    hash, so each block's slice is hashed as it is."""
    block_size: int
    lora_name: str | None = None
    cache_salt: str | None = None
    medium: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    """vLLM: one entry per block, untagged: the LoRA name, (mm identifier, offset) pairs, the cache
    salt (first block only), prompt-embedding digests; None where a block has none."""
    kind: str | None = None
    """The KV cache group's kind (vLLM's kv_cache_spec_kind); None when the engine does not say."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(unpacked(self.tokens))


@value
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@value
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@value
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    rank: int | None = None
    """The data-parallel (vLLM) or attention-DP (SGLang) rank that published it."""


class TypedDecoder:
    """The typed path of decode_batch: None for a payload it does not take whole."""

    def __init__(self) -> None:
        self._decoder = msgspec.msgpack.Decoder(WireBatch)

    def __call__(self, payload: bytes) -> EventBatch | None:
        try:
            raw = self._decoder.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        events: list[KVEvent] = []
        for e in raw.events:  # positional arguments: keywords cost twice the value's construction
            if type(e) is WireStored:
                extra = e.extra_keys
                try:
                    tokens = array(TOKEN_TYPE, e.token_ids).tobytes()
                except OverflowError:  # an id outside 0..2^32-1: the generic path names it
                    return None
                events.append(
                    BlockStored(
                        tuple(e.block_hashes),
                        e.parent_block_hash,
                        tokens,
                        e.block_size,
                        e.lora_name,
                        e.cache_salt,
                        e.medium,
                        tuple([_frozen(x) for x in extra]) if extra is not None else None,
                        e.kv_cache_spec_kind,
                    )
                )
            elif type(e) is WireRemoved:
                events.append(BlockRemoved(tuple(e.block_hashes), e.medium))
            else:
                events.append(AllBlocksCleared())
        return EventBatch(raw.ts, tuple(events), raw.rank)


def decode_batch(payload: bytes, engine: str = "vllm", typed: TypedDecoder | None = None) -> EventBatch:
    """The batch in one msgpack payload; `engine` picks the field order of array-shaped events;
    `typed`: try that decoder first (its payloads decode the same either way, faster)."""
    if typed is not None:
        batch = typed(payload)
        if batch is not None:
            return batch
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"not msgpack: {exc}") from None
    # The generic decode gives plain dicts and lists: exact type checks, not the ABCs' (several times slower,
    # and a batch is decoded for every engine step on the event loop).
    if type(raw) is dict:
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank", raw.get("attn_dp_rank"))
    elif type(raw) is list and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        raise EventDecodeError("an EventBatch is [ts, events, rank]")
    if not isinstance(ts, (int, float)) or type(events) is not list:
        raise EventDecodeError("an EventBatch is [ts, events, rank]")
    fields = STORED_FIELDS.get(engine, STORED_FIELDS["vllm"])
    decoded = []
    for item in events:
        event = decode_event(item, fields)
        if event is not None:
            decoded.append(event)
    return EventBatch(float(ts), tuple(decoded), rank if type(rank) is int else None)


def decode_event(item: Any, stored_fields: Sequence[str] = STORED_FIELDS["vllm"]) -> KVEvent | None:
    """One event, or None for a type this gateway does not use."""
    fields: Mapping[str, Any]
    if type(item) is dict:
        tag, fields = item.get("type"), item
    elif type(item) is list and item and type(item[0]) is str:
        tag = item[0]
        names = stored_fields if tag == "BlockStored" else REMOVED_FIELDS
        fields = dict(zip(names, item[1:], strict=False))
    else:
        raise EventDecodeError(f"an event is a tagged map or array, got {type(item).__name__}")
    if tag == "BlockStored":
        return _stored(fields)
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(fields.get("block_hashes")), _str(fields.get("medium")))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _stored(fields: Mapping[str, Any]) -> BlockStored:
    tokens = fields.get("token_ids")
    size = fields.get("block_size")
    if type(tokens) is not list:
        raise EventDecodeError("BlockStored.token_ids must be a list of token ids")
    try:  # one C call checks every id (a per-id isinstance was most of a batch's decoding)
        packed = array(TOKEN_TYPE, tokens).tobytes()
    except (TypeError, OverflowError):
        raise EventDecodeError("BlockStored.token_ids must be token ids (ints from 0 to 2**32 - 1)") from None
    if type(size) is not int or size < 1:
        raise EventDecodeError("BlockStored.block_size must be a positive int")
    parent = fields.get("parent_block_hash")
    extra = fields.get("extra_keys")
    return BlockStored(
        block_hashes=_hashes(fields.get("block_hashes")),
        parent_block_hash=_hash(parent) if parent is not None else None,
        tokens=packed,
        block_size=size,
        lora_name=_str(fields.get("lora_name")),
        cache_salt=_str(fields.get("cache_salt")),
        medium=_str(fields.get("medium")),
        extra_keys=tuple(_frozen(e) for e in extra) if type(extra) is list else None,
        kind=_str(fields.get("kv_cache_spec_kind")),
    )


def _hash(h: Any) -> BlockHash:
    if isinstance(h, bool) or not isinstance(h, int | bytes):
        raise EventDecodeError(f"a block hash is an int or bytes, got {type(h).__name__}")
    return h


HASH_TYPES: Final = frozenset({int, bytes})


def _hashes(items: Any) -> tuple[BlockHash, ...]:
    if type(items) is not list:
        raise EventDecodeError("block_hashes must be a list")
    if not HASH_TYPES.issuperset(map(type, items)):  # one C pass; a bool is not an int here
        raise EventDecodeError("a block hash is an int or bytes")
    return tuple(items)


def _str(v: Any) -> str | None:
    return v if type(v) is str else None


def _frozen(v: Any) -> Any:
    """msgpack arrays as tuples, so the event stays hashable and immutable."""
    return tuple(_frozen(x) for x in v) if isinstance(v, list) else v
