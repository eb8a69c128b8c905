"""A client that leaves at any stage stops the engine's work for it (docs/reliability.md items 23-27)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.live.conftest import Stack, StackFactory, chat, raw_request, sim_params, small_window_request

pytestmark = pytest.mark.live


async def leave_after(stack: Stack, body: dict[str, object], read_bytes: int, fault: str) -> None:
    reader, writer = await raw_request(
        stack.base_url, "/v1/chat/completions", json.dumps(body).encode(), {"x-sim-fault": fault}
    )
    got = b""
    while len(got) < read_bytes:
        chunk = await reader.read(read_bytes - len(got))
        assert chunk, "the gateway closed first"
        got += chunk
    writer.close()
    await writer.wait_closed()


async def wait_aborted(stack: Stack) -> None:
    sim = stack.sims["vllm-0"]
    await sim.wait_until(lambda s: s.aborted == 1 and s.active == 0, timeout=1.0)


async def test_leave_mid_stream(make_stack: StackFactory) -> None:
    stack = await make_stack()
    await leave_after(stack, chat(stream=True, max_tokens=500), 600, "chunk_delay=0.02")
    await wait_aborted(stack)
    await stack.wait_metric("gateway_client_disconnects_total", 1, stage="mid_stream")
    assert stack.total("gateway_requests_total", outcome="client_closed") == 1
    assert stack.total("gateway_disconnect_wasted_tokens_total") > 0


async def test_leave_while_waiting_for_first_byte(make_stack: StackFactory) -> None:
    stack = await make_stack()
    # max_tokens set: a budget the gateway chose would be counted by the engine first, and the fault
    # delays that count too.
    task = asyncio.create_task(leave_after(stack, chat(stream=True, max_tokens=16), 0, "headers_delay=5"))
    sim = stack.sims["vllm-0"]
    await sim.wait_until(lambda s: s.active == 1, timeout=2)
    await task
    await wait_aborted(stack)
    await stack.wait_metric("gateway_client_disconnects_total", 1, stage="waiting_first_byte")
    assert stack.total("gateway_time_to_first_token_seconds_count") == 0  # no TTFT sample for a no-show


async def test_leave_during_non_stream_generation(make_stack: StackFactory) -> None:
    stack = await make_stack()
    task = asyncio.create_task(leave_after(stack, chat(max_tokens=2000), 0, "chunk_delay=0.01"))
    sim = stack.sims["vllm-0"]
    await sim.wait_until(lambda s: s.active == 1, timeout=2)
    await task
    await wait_aborted(stack)
    await stack.wait_metric("gateway_client_disconnects_total", 1, stage="non_stream")


async def test_leave_after_a_large_body_while_waiting_for_first_byte(make_stack: StackFactory) -> None:
    """A body over uvicorn's 64 KiB read-ahead: the server had stopped reading the socket, and with no
    listener calling receive() the client's close was never seen (the engine went on)."""
    stack = await make_stack()
    body = chat(stream=True, max_tokens=16, pad="x" * 300_000)  # pad: passed on, ignored by the engine
    task = asyncio.create_task(leave_after(stack, body, 0, "headers_delay=5"))
    sim = stack.sims["vllm-0"]
    await sim.wait_until(lambda s: s.active == 1, timeout=2)
    await task
    await wait_aborted(stack)
    await stack.wait_metric("gateway_client_disconnects_total", 1, stage="waiting_first_byte")


async def test_leave_before_the_body_is_sent(make_stack: StackFactory) -> None:
    stack = await make_stack()
    host, port = stack.base_url.removeprefix("http://").split(":")
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{"model":')
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await stack.wait_metric("gateway_client_disconnects_total", 1, stage="before_backend")
    assert stack.sims["vllm-0"].stats.seen == 0


async def test_many_random_disconnects_leave_nothing_behind(make_stack: StackFactory) -> None:
    """docs/reliability.md item 29 in small: every engine-seen abort is a gateway client_closed, and a burst
    afterwards still succeeds (no leaked connection slots)."""
    stack = await make_stack()

    async def one(i: int) -> None:
        stream = i % 2 == 0
        await leave_after(
            stack, chat(stream=stream, max_tokens=300), (i * 37) % 400 if stream else 0, "chunk_delay=0.005"
        )

    await asyncio.gather(*(one(i) for i in range(40)))
    sim = stack.sims["vllm-0"]
    await sim.wait_until(lambda s: s.active == 0, timeout=3)
    await stack.wait_metric("gateway_requests_total", 40)
    closed = stack.total("gateway_requests_total", outcome="client_closed")
    assert closed == 40
    # Every request that reached the engine was aborted there; none ran on for a client who left.
    # (A client that leaves while the gateway is still connecting never reaches the engine at all.)
    assert 0 < sim.stats.seen <= closed
    assert sim.stats.aborted == sim.stats.seen and sim.stats.completed == 0
    async with httpx.AsyncClient() as client:
        replies = await asyncio.gather(
            *(client.post(stack.base_url + "/v1/chat/completions", json=chat(max_tokens=2)) for _ in range(30))
        )
    assert all(r.status_code == 200 for r in replies)


async def test_client_that_stops_reading_is_cut_and_the_engine_freed(make_stack: StackFactory) -> None:
    """docs/reliability.md items 28/53: a client that keeps its socket open but stops reading. The gateway's
    writes back up, the idle limit fires, the upstream request is aborted, and the task ends."""
    # An engine that streams as fast as the event loop allows, so the socket buffers fill quickly.
    stack = await make_stack(
        pools={
            "vllm": [
                sim_params(base_step_s=1e-5, per_seq_step_s=0.0, context_limit=1_000_000, kv_budget_tokens=10_000_000)
            ]
        },
        timeouts={"idle_s": 0.5, "keepalive_s": 0},
    )
    sock = await small_window_request(stack.base_url, chat(stream=True, max_tokens=100_000))
    sim = stack.sims["vllm-0"]
    try:
        await sim.wait_until(lambda s: s.aborted == 1, timeout=30)
        await stack.wait_metric("gateway_requests_total", 1, timeout=10, outcome="timeout_idle")
    finally:
        sock.close()
