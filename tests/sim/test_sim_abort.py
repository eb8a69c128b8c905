"""A client that goes away is counted as aborted and its work stops at once: mid-stream, during a
non-streaming generation, while queued for KV space, and while waiting for headers."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest

from tests.sim.sim_helpers import CHAT_PATH, RawConn, SimFactory, chat_body

pytestmark = pytest.mark.live

# Tokens: far more than any test waits for, yet within the fast preset's 4096-token context (a vLLM
# max_tokens above max_model_len is a 400).
LONG = 4_000


async def assert_aborted_and_idle(sim, generated_before: int) -> None:  # type: ignore[no-untyped-def]
    await sim.wait_until(lambda s: s.aborted == 1 and s.active == 0 and s.running == 0 and s.waiting == 0, 1.0)
    assert sim.stats.completed == 0
    assert sim.engine.core.counters.finished["abort"] == 1
    record = sim.stats.recent[-1]
    assert record.outcome == "aborted" and record.disconnected_at is not None
    # The work stopped: no step ran for it after the abort was seen.
    assert sim.engine.core.counters.generation_tokens <= generated_before + 1


async def test_disconnect_mid_stream(make_sim: SimFactory) -> None:
    sim = await make_sim(base_step_s=0.005)
    conn = await RawConn.open(sim.port)
    await conn.send("POST", CHAT_PATH, chat_body(max_tokens=LONG, stream=True))
    await conn.head()
    for _ in range(4):
        await asyncio.wait_for(conn.event(), 2)
    await conn.close()
    await assert_aborted_and_idle(sim, sim.engine.core.counters.generation_tokens)
    assert sim.engine.core.counters.generation_tokens < 100


async def test_reset_mid_stream(make_sim: SimFactory) -> None:
    sim = await make_sim(base_step_s=0.005)
    conn = await RawConn.open(sim.port)
    await conn.send("POST", CHAT_PATH, chat_body(max_tokens=LONG, stream=True))
    await conn.head()
    await asyncio.wait_for(conn.event(), 2)
    sock = conn.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.writer.transport.abort()  # the client resets instead of closing
    await assert_aborted_and_idle(sim, sim.engine.core.counters.generation_tokens)


async def test_disconnect_during_non_streaming_generation(make_sim: SimFactory) -> None:
    sim = await make_sim(base_step_s=0.005)
    conn = await RawConn.open(sim.port)
    await conn.send("POST", CHAT_PATH, chat_body(max_tokens=LONG))
    await sim.wait_until(lambda s: s.running == 1, 2)
    await sim.wait_until(lambda s: s.core.counters.generation_tokens >= 3, 2)
    await conn.close()
    await assert_aborted_and_idle(sim, sim.engine.core.counters.generation_tokens)


async def test_disconnect_while_queued_for_kv(make_sim: SimFactory) -> None:
    sim = await make_sim(base_step_s=0.005, kv_budget_tokens=200)
    first = await RawConn.open(sim.port)
    await first.send("POST", CHAT_PATH, chat_body(max_tokens=150, stream=True))
    await sim.wait_until(lambda s: s.running == 1, 2)
    queued = await RawConn.open(sim.port)
    await queued.send("POST", CHAT_PATH, chat_body(max_tokens=150, stream=True))
    await sim.wait_until(lambda s: s.waiting == 1, 2)
    await queued.close()
    await sim.wait_until(lambda s: s.aborted == 1 and s.waiting == 0, 1.0)
    assert sim.stats.running == 1  # the other one is untouched
    status, headers = await first.head()
    events = json.loads((await first.body(headers)).split(b"data: ")[-2].rstrip())
    assert status == 200 and events["choices"][0]["finish_reason"] == "length"
    await first.close()
    await sim.wait_until(lambda s: s.completed == 1 and s.active == 0, 2)


async def test_disconnect_during_headers_delay(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await RawConn.open(sim.port)
    await conn.send("POST", CHAT_PATH, chat_body(stream=True), {"x-sim-fault": "headers_delay=30"})
    await sim.wait_until(lambda s: s.active == 1, 2)
    await conn.close()
    await sim.wait_until(lambda s: s.aborted == 1 and s.active == 0, 1.0)
    assert sim.engine.core.counters.prompt_tokens == 0  # the model never saw it


async def test_stop_ends_open_requests_without_counting_aborts(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await RawConn.open(sim.port)
    await conn.send("POST", CHAT_PATH, chat_body(), {"x-sim-fault": "never=1"})
    await sim.wait_until(lambda s: s.active == 1, 2)
    await sim.stop()
    assert sim.stats.active == 0 and sim.stats.aborted == 0
    assert sim.stats.recent[-1].outcome == "cancelled"
    assert await asyncio.wait_for(conn.reader.read(10), 2) == b""
    await conn.close()
