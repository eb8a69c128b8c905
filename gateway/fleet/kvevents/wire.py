"""The KV-event batch as vLLM and SGLang publish it today, as msgspec structs: what
decode.TypedDecoder decodes a payload into, in C, checking every field's type on the way. An
array batch (`[ts, events, rank]`) of map-shaped events tagged by `type`.

Stays Python in the compiled build (setup.py): mypyc drops a class's keywords, and msgspec reads
the tag, the tag field and the array shape from them."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec


class WireStored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    """BlockStored as vLLM (>= 0.11) and SGLang publish it; fields of neither engine are ignored."""

    block_hashes: list[int | bytes]
    token_ids: list[int]
    """Not range-checked here: packing them (blockkeys.TOKEN_TYPE) checks every id in one C call,
    and a range constraint made the decode a third slower."""
    block_size: Annotated[int, msgspec.Meta(ge=1)]
    parent_block_hash: int | bytes | None = None
    lora_name: str | None = None
    cache_salt: str | None = None
    medium: str | None = None
    extra_keys: list[Any] | None = None
    kv_cache_spec_kind: str | None = None


class WireRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    block_hashes: list[int | bytes]
    medium: str | None = None


class WireCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


class WireBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[WireStored | WireRemoved | WireCleared]
    rank: int | None = None
