"""The KV-event decoder and per-engine index, from batches recorded on a real vLLM (and SGLang where
recorded): tests/fixtures/kv_events/record.py. Each recorded encoding is also re-encoded into the
other shape (array-shaped events, bytes hashes) so both decode paths see real data."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.fleet.kvevents.decode import (
    STORED_FIELDS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    TypedDecoder,
    decode_batch,
)
from gateway.fleet.kvevents.index import EngineIndex
from gateway.policy.blockkeys import chain_keys, packed

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kv_events"
RECORDED = sorted(p.stem for p in FIXTURES.glob("*.json"))


def _load(engine: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{engine}.json").read_text(encoding="utf-8"))
    return data


def _payloads(data: dict[str, Any], key: str = "frames") -> list[bytes]:
    return [base64.b64decode(frames[2]) for frames in data[key]]


def _as_arrays(payload: bytes, engine: str) -> bytes:
    """The same batch with every event array-shaped, as older vLLM and SGLang releases send it."""
    ts, events, *rest = msgspec.msgpack.decode(payload)
    out = []
    for e in events:
        names = STORED_FIELDS[engine] if e["type"] == "BlockStored" else ("block_hashes", "medium")
        out.append([e["type"], *(e.get(n) for n in names)] if e["type"] != "AllBlocksCleared" else [e["type"]])
    packed: bytes = msgspec.msgpack.encode([ts, out, *rest])
    return packed


def _bytes_hashes(payload: bytes) -> bytes:
    """The same batch with block hashes as bytes (vLLM with a non-64-bit hash function)."""
    ts, events, *rest = msgspec.msgpack.decode(payload)

    def conv(h: Any) -> Any:
        return h.to_bytes(32, "big", signed=True) if isinstance(h, int) else h

    for e in events:
        if "block_hashes" in e:
            e["block_hashes"] = [conv(h) for h in e["block_hashes"]]
        if e.get("parent_block_hash") is not None:
            e["parent_block_hash"] = conv(e["parent_block_hash"])
    packed: bytes = msgspec.msgpack.encode([ts, events, *rest])
    return packed


ENCODINGS = ["recorded", "arrays", "bytes_hashes"]


def _encoded(engine: str, encoding: str) -> list[bytes]:
    payloads = _payloads(_load(engine))
    if encoding == "arrays":
        return [_as_arrays(p, engine) for p in payloads]
    if encoding == "bytes_hashes":
        return [_bytes_hashes(p) for p in payloads]
    return payloads


@pytest.mark.parametrize("engine", RECORDED)
def test_the_recording_holds_every_event_type(engine: str) -> None:
    batches = [decode_batch(p, engine) for p in _payloads(_load(engine))]
    kinds = {type(e) for b in batches for e in b.events}
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}
    first = next(e for b in batches for e in b.events if isinstance(e, BlockStored))
    assert first.parent_block_hash is None and len(first.token_ids) == first.block_size * len(first.block_hashes)


@pytest.mark.parametrize("engine", RECORDED)
@pytest.mark.parametrize("encoding", ["recorded", "bytes_hashes"])
def test_the_typed_decoder_takes_every_recorded_batch_and_agrees(engine: str, encoding: str) -> None:
    """The engines' own shape goes the fast way, and gives what the generic path gives."""
    typed = TypedDecoder()
    for payload in _encoded(engine, encoding):
        fast = typed(payload)
        assert fast is not None
        assert fast == decode_batch(payload, engine)


@pytest.mark.parametrize(
    "payload",
    [
        msgspec.msgpack.encode([0.0, [["BlockStored", [1], None, [1, 2], 2]]]),  # array-shaped
        msgspec.msgpack.encode({"ts": 0.0, "events": []}),  # a map batch
        msgspec.msgpack.encode([0.0, [{"type": "Future"}]]),  # an event type it does not know
        msgspec.msgpack.encode([0.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": 3}]]),
        msgspec.msgpack.encode(
            [0.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [-1], "block_size": 1}]]
        ),
        b"\xc1",
    ],
)
def test_the_typed_decoder_leaves_other_shapes_to_the_generic_path(payload: bytes) -> None:
    assert TypedDecoder()(payload) is None


def test_a_batch_the_typed_decoder_refuses_still_decodes_as_before() -> None:
    """decode_batch with the typed decoder falls back: same events, same errors."""
    typed = TypedDecoder()
    odd = msgspec.msgpack.encode(
        [1.0, [{"type": "Future"}, {"type": "BlockRemoved", "block_hashes": [5], "medium": 3}]]
    )
    assert decode_batch(odd, typed=typed) == EventBatch(1.0, (BlockRemoved((5,), None),), None)
    bad = msgspec.msgpack.encode(
        [0.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [-1], "block_size": 1}]]
    )
    with pytest.raises(EventDecodeError, match="token ids"):
        decode_batch(bad, typed=typed)


@pytest.mark.parametrize("engine", RECORDED)
@pytest.mark.parametrize("encoding", ENCODINGS[1:])
def test_other_encodings_decode_to_the_same_events(engine: str, encoding: str) -> None:
    recorded = [decode_batch(p, engine) for p in _payloads(_load(engine))]
    other = [decode_batch(p, engine) for p in _encoded(engine, encoding)]
    assert [len(b.events) for b in other] == [len(b.events) for b in recorded]
    for a, b in zip(recorded, other, strict=True):
        for x, y in zip(a.events, b.events, strict=True):
            assert type(x) is type(y)
            if isinstance(x, BlockStored) and isinstance(y, BlockStored):
                assert (x.token_ids, x.block_size, x.lora_name) == (y.token_ids, y.block_size, y.lora_name)
                assert len(x.block_hashes) == len(y.block_hashes)


@pytest.mark.parametrize("engine", RECORDED)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_index_predicts_the_engines_own_prefix_cache_hits(engine: str, encoding: str) -> None:
    """Before each scripted request, the index built from the batches heard so far says how many of
    the request's tokens the engine will find cached; the engine's reported cached_tokens agrees."""
    data = _load(engine)
    payloads = _encoded(engine, encoding)
    index = EngineIndex()
    applied = 0
    checked = []
    stale = 0
    for request in data["requests"]:
        for p in payloads[applied : request["frames_before"]]:
            index.apply(decode_batch(p, engine))
        applied = request["frames_before"]
        assert index.block_size is not None or applied == 0
        size = index.block_size or 1
        predicted = index.match_tokens(request["prompt_token_ids"]) * size
        following = decode_batch(payloads[applied], engine) if applied < len(payloads) else None
        if following is not None and isinstance(following.events[0], AllBlocksCleared):
            # vLLM publishes a cache reset with the next engine step: the one that serves this
            # request. For that one request the index still shows what the reset dropped.
            assert predicted > request["cached_tokens"]
            stale += 1
            index.apply(EventBatch(following.ts, following.events[:1]))
            predicted = index.match_tokens(request["prompt_token_ids"]) * size
        checked.append((request["name"], predicted, request["cached_tokens"]))
    assert [(n, e) for n, _, e in checked] == [(n, p) for n, p, _ in checked]
    assert any(e > 0 for _, _, e in checked) and any(e == 0 for _, _, e in checked[1:])
    assert index.unchained == 0 and stale <= 1


@pytest.mark.parametrize("engine", RECORDED)
def test_the_replay_answer_is_the_published_stream(engine: str) -> None:
    """The replay answer from 0 holds every published batch, those the recorder heard among them (an
    engine publishes at start-up, before a subscriber can have joined)."""
    data = _load(engine)
    heard = {int.from_bytes(base64.b64decode(f[1]), "big"): f[2] for f in data["frames"]}
    replayed = {int.from_bytes(base64.b64decode(f[1]), "big"): f[2] for f in data["replay"]}
    assert sorted(replayed) == list(range(len(replayed)))
    assert heard and all(replayed[seq] == payload for seq, payload in heard.items())


@pytest.mark.parametrize("engine", RECORDED)
def test_evictions_and_clears_shrink_the_index(engine: str) -> None:
    sizes = []
    index = EngineIndex()
    for p in _payloads(_load(engine)):
        batch = decode_batch(p, engine)
        before = len(index)
        index.apply(batch)
        sizes.append((before, len(index), {type(e).__name__ for e in batch.events}))
    assert any(after < before + 2 for before, after, kinds in sizes if "BlockRemoved" in kinds)
    cleared = [(before, after) for before, after, kinds in sizes if "AllBlocksCleared" in kinds]
    assert cleared and all(after < before for before, after in cleared)


def _stored(hashes: list[int], tokens: list[int], parent: int | None = None, **extra: Any) -> BlockStored:
    return BlockStored(tuple(hashes), parent, packed(tokens), 4, **extra)


def _batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> EventBatch:
    return EventBatch(0.0, events)


def test_the_last_token_of_a_prompt_is_never_a_hit() -> None:
    index = EngineIndex()
    index.apply(_batch(_stored([1, 2], list(range(8)))))
    assert (index.match_tokens(list(range(8))), index.match_tokens(list(range(9)))) == (1, 2)


def test_lora_and_cache_salt_are_part_of_the_key() -> None:
    """vLLM publishes the LoRA name and the cache salt, untagged, in the first block's extra keys."""
    tokens = list(range(8))
    index = EngineIndex()
    index.apply(_batch(_stored([1, 2], tokens, lora_name="ad", extra_keys=(("ad", "salt"), ("ad",)))))
    assert index.match_tokens([*tokens, 99], "ad", "salt") == 2
    assert index.match_tokens([*tokens, 99], "ad") == 0
    assert index.match_tokens([*tokens, 99], None, "salt") == 0
    assert index.match_tokens([*tokens, 99]) == 0


def test_sglangs_cache_salt_field_is_part_of_the_key() -> None:
    tokens = list(range(8))
    index = EngineIndex()
    index.apply(_batch(_stored([1, 2], tokens, cache_salt="s")))
    assert (index.match_tokens([*tokens, 99], cache_salt="s"), index.match_tokens([*tokens, 99])) == (2, 0)


def test_a_block_with_an_image_never_matches_text() -> None:
    tokens = list(range(8))
    index = EngineIndex()
    index.apply(_batch(_stored([1, 2], tokens, extra_keys=(None, (("img-1", 0),)))))
    assert index.match_tokens([*tokens, 99]) == 1


def test_children_chain_from_their_parents_key_and_removal_cuts_the_match() -> None:
    tokens = list(range(12))
    index = EngineIndex()
    index.apply(_batch(_stored([1], tokens[:4]), _stored([2, 3], tokens[4:], parent=1)))
    assert index.match_tokens([*tokens, 99]) == 3 and len(index) == 3
    index.apply(_batch(BlockRemoved((2,))))
    assert index.match_tokens([*tokens, 99]) == 1 and len(index) == 2
    index.apply(_batch(_stored([9], tokens[4:8], parent=77)))
    assert index.unchained == 1 and len(index) == 2
    index.apply(_batch(AllBlocksCleared()))
    assert len(index) == 0 and index.match_tokens([*tokens, 99]) == 0


def test_a_re_reported_block_is_counted_once() -> None:
    tokens = list(range(4))
    index = EngineIndex()
    index.apply(_batch(_stored([1], tokens), _stored([1], tokens)))
    index.apply(_batch(BlockRemoved((1,))))
    assert len(index) == 0


def test_other_tiers_and_sliding_groups_are_not_indexed() -> None:
    tokens = list(range(4))
    index = EngineIndex()
    index.apply(_batch(_stored([1], tokens, medium="CPU"), _stored([2], tokens, kind="sliding_window")))
    assert len(index) == 0


def test_the_keys_are_the_gateways_own() -> None:
    assert chain_keys(list(range(8)), 4) == chain_keys([*list(range(8)), 1, 2], 4)
    assert chain_keys(list(range(8)), 4)[1] != chain_keys([0, 1, 2, 4, 4, 5, 6, 7], 4)[1]
    assert chain_keys(list(range(8)), 4) != chain_keys(list(range(8)), 2)[:2]
    with pytest.raises(ValueError):
        chain_keys([1], 0)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgspec.msgpack.encode({"x": 1}),
        msgspec.msgpack.encode([0.0, [7]]),
        msgspec.msgpack.encode([0.0, [{"type": "BlockStored"}]]),
        *(
            msgspec.msgpack.encode(
                [0.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1, bad], "block_size": 2}]]
            )
            for bad in (-1, 2**32, 1.5, "2", None)
        ),
    ],
)
def test_a_malformed_payload_is_a_decode_error(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_batch(payload)


def test_an_unknown_event_type_is_skipped() -> None:
    batch = decode_batch(msgspec.msgpack.encode([1.5, [{"type": "Future"}, {"type": "AllBlocksCleared"}], 0]))
    assert batch == EventBatch(1.5, (AllBlocksCleared(),), 0)
