"""Many deadlines on one timer (gateway/deadlines.py): each ends on time, never early, once."""

from __future__ import annotations

import asyncio
import functools

import pytest

from gateway.deadlines import SLACK_S, Deadlines

pytestmark = pytest.mark.unit


async def test_each_deadline_ends_on_time_and_a_discarded_one_never() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    ended: dict[str, float] = {}
    start = loop.time()
    deadlines.add("late", 0.2, lambda: ended.setdefault("late", loop.time() - start), loop)
    deadlines.add("early", 0.05, lambda: ended.setdefault("early", loop.time() - start), loop)  # re-arms
    deadlines.add("dropped", 0.1, lambda: ended.setdefault("dropped", loop.time() - start), loop)
    deadlines.discard("dropped")
    await asyncio.sleep(0.35)
    assert set(ended) == {"early", "late"}
    assert 0.049 <= ended["early"] < 0.05 + SLACK_S + 0.05
    assert 0.199 <= ended["late"] < 0.2 + SLACK_S + 0.05
    assert len(deadlines) == 0


async def test_a_key_added_again_keeps_only_its_new_deadline() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    calls: list[str] = []
    deadlines.add("k", 0.05, lambda: calls.append("first"), loop)
    deadlines.add("k", 0.15, lambda: calls.append("second"), loop)
    await asyncio.sleep(0.1)
    assert calls == []
    await asyncio.sleep(0.15)
    assert calls == ["second"]


async def test_a_failing_callback_does_not_keep_the_others_from_their_deadline() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    calls: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    deadlines.add("a", 0.02, boom, loop)
    for i in range(50):
        deadlines.add(i, 0.02 + i * 0.001, functools.partial(calls.append, i), loop)
    await asyncio.sleep(0.2)
    assert sorted(calls) == list(range(50))


async def test_close_ends_nothing() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    calls: list[str] = []
    deadlines.add("k", 0.02, lambda: calls.append("k"), loop)
    deadlines.close()
    await asyncio.sleep(0.06)
    assert calls == []
