"""A prompt just routed counts as held by the backend it went to until its own events can have come:
the same conversation's next request, decided before the engine prefilled the first, follows it."""

from __future__ import annotations

import pytest

from gateway.config_loader import parse_config
from gateway.fleet.kvevents.decode import BlockStored, EventBatch
from gateway.fleet.kvevents.fleet import MAX_PENDING, PENDING_S, KVEventFleet
from gateway.policy.blockkeys import packed

pytestmark = pytest.mark.unit

PROMPT = list(range(100, 113))  # three full 4-token blocks before the last token


def fleet() -> KVEventFleet:
    backends = [
        {
            "url": f"http://127.0.0.1:{9000 + i}",
            "name": f"r{i}",
            "kv_events": {"endpoint": f"tcp://127.0.0.1:{5550 + i}"},
        }
        for i in range(2)
    ]
    config = parse_config(
        {
            "pools": {"p": {"engine": "vllm", "balancer": "kv_events", "backends": backends}},
            "routes": [{"model": "m", "pools": ["p"]}],
        },
        env={},
    )
    made = KVEventFleet(config)
    for sub in made.subscribers.values():  # one event each tells the index the block size (4)
        sub.index.apply(EventBatch(0.0, (BlockStored((1,), None, packed([1, 2, 3, 4]), 4),)))
    return made


def held(f: KVEventFleet, now: float) -> dict[str, int]:
    return dict(f.cached(["r0", "r1"], PROMPT, now).cached.blocks)


def test_a_routed_prompt_counts_as_held_where_it_went_until_its_events_are_due() -> None:
    f = fleet()
    try:
        assert held(f, 0.0) == {"r0": 0, "r1": 0}
        f.decided("r1", f.cached(["r0", "r1"], PROMPT, 0.0), 0.0)
        assert held(f, 1.0) == {"r0": 0, "r1": 3}
        assert held(f, PENDING_S + 0.1) == {"r0": 0, "r1": 0}
        # A longer prompt of the same conversation matches the noted blocks, and no further.
        longer = f.cached(["r1"], [*PROMPT, 7, 8, 9, 10], 1.0).cached.blocks
        assert dict(longer) == {"r1": 3}
    finally:
        f.close()


def test_the_pending_notes_are_bounded() -> None:
    f = fleet()
    try:
        big = list(range(4 * (MAX_PENDING + 1) + 1))
        f.decided("r0", f.cached(["r0"], big, 0.0), 0.0)  # more keys than the bound: none noted
        assert held(f, 0.0) == {"r0": 0, "r1": 0}
    finally:
        f.close()
