"""SIGTERM during active streams (RELIABILITY 21): readiness fails at once, streams that finish
within the drain timeout finish, the rest get one error event and their upstream is aborted, and
the server exits within drain + 5 s."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from tests.live.conftest import StackFactory, chat, sse_events

pytestmark = pytest.mark.live


async def test_drain_finishes_short_streams_and_cuts_long_ones(make_stack: StackFactory) -> None:
    stack = await make_stack(server={"drain_timeout_s": 1.0})
    sim = stack.sims["vllm-0"]

    async def stream(tokens: int) -> bytes:
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(
                stack.base_url + "/v1/chat/completions",
                json=chat(stream=True, max_tokens=tokens),
                headers={"x-sim-fault": "chunk_delay=0.05"},
            )
            return r.content

    short = asyncio.create_task(stream(8))  # ~0.4 s: inside the drain window
    long = asyncio.create_task(stream(400))  # ~20 s: cut at the deadline
    await sim.wait_until(lambda s: s.active == 2, timeout=3)
    async with httpx.AsyncClient() as client:
        assert (await client.get(stack.base_url + "/readyz")).status_code == 200
    started = time.monotonic()
    stack.server.handle_exit(signal.SIGTERM, None)
    assert stack.gateway.lifecycle.draining
    short_body, long_body = await asyncio.gather(short, long)
    assert sse_events(short_body)[-1] == "[DONE]"
    last = sse_events(long_body)[-1]
    assert last != "[DONE]" and json.loads(last)["error"]["code"] == "shutdown"
    await asyncio.wait_for(stack.task, timeout=6)
    assert time.monotonic() - started < 1.0 + 5
    await sim.wait_until(lambda s: s.aborted == 1 and s.active == 0, timeout=1)
    assert stack.total("gateway_requests_total", outcome="overloaded") == 1
    assert stack.total("gateway_requests_total", outcome="success") == 1


async def test_an_engine_that_goes_during_the_drain_is_not_blamed(make_stack: StackFactory) -> None:
    """One Ctrl-C often stops the engine with the gateway: a stream the engine cuts while the
    gateway drains ends with the gateway's own shutdown event, and counts nothing against the backend."""
    stack = await make_stack(server={"drain_timeout_s": 5.0})
    sim = stack.sims["vllm-0"]

    async def stream() -> bytes:
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(
                stack.base_url + "/v1/chat/completions",
                json=chat(stream=True, max_tokens=400),
                headers={"x-sim-fault": "chunk_delay=0.05;die_after=20;die=rst"},
            )
            return r.content

    task = asyncio.create_task(stream())
    await sim.wait_until(lambda s: s.active == 1, timeout=3)
    stack.server.handle_exit(signal.SIGTERM, None)  # draining from here; the engine dies ~1 s in
    events = sse_events(await task)
    error = json.loads(events[-1])["error"]
    assert error["code"] == "shutdown" and "gateway is shutting down" in error["message"]
    assert "vllm-0" not in error["message"]
    assert stack.total("gateway_upstream_errors_total") == 0
    assert stack.gateway.registry.by_name["vllm-0"].healthy
    await asyncio.wait_for(stack.task, timeout=6)
