"""The overhead benchmark's KV-event publisher (benchmarks/overhead/kv_publisher.py): the events it
deals out keep each engine's index at the `keep` requests an engine with a full cache holds, every
removal finding the block that engine stored `keep` requests before, for as long as the cycle of
events is reused."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from benchmarks.overhead import kv_publisher, kvevents
from gateway.fleet.kvevents.decode import BlockStored, decode_batch
from gateway.fleet.kvevents.index import EngineIndex

pytestmark = pytest.mark.unit

KEEP = 10


def batch(events: list[dict[str, Any]]) -> bytes:
    payload: bytes = msgspec.msgpack.encode([0.0, events, 0])
    return payload


def test_each_engine_holds_its_last_keep_requests_through_reuse_of_the_cycle() -> None:
    ids = list(range(1, 300))  # 299 ids + 128 generated: 3 blocks a request
    requests = kv_publisher.cycle(ids, KEEP)
    engines = [EngineIndex(), EngineIndex()]
    for r in range(5 * len(requests)):  # past the cycle's end several times, as a long run does
        engines[r % 2].apply(decode_batch(batch(requests[r % len(requests)])))
    for index in engines:
        # KEEP requests dealt alternately: each engine holds the blocks of its last KEEP / 2.
        assert len(index._by_hash) == KEEP // 2 * 3
        assert len(index) == 3  # the same tokens every request: one chain of keys
        assert index.match_tokens([*ids, *[kvevents.FILLER] * 128]) == 3


def test_a_step_batch_carries_every_request_of_the_step() -> None:
    requests = kv_publisher.cycle(list(range(1, 300)), KEEP)
    step = [event for request in requests[:4] for event in request]
    decoded = decode_batch(batch(step))
    stored = [e for e in decoded.events if isinstance(e, BlockStored)]
    assert len(stored) == 4 and {h for e in stored for h in e.block_hashes} == set(range(1, 13))
