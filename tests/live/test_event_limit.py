"""A backend that sends one huge SSE event (docs/reliability.md, "Backend isolation"): past
limits.max_event_bytes the stream is cut with the protocol's error event and no [DONE], the
upstream is closed, and the backend, not the client, is charged with the failure."""

from __future__ import annotations

import httpx
import pytest

from tests.live.conftest import StackFactory, chat, sse_events

pytestmark = pytest.mark.live


@pytest.mark.parametrize("usage", [False, True])
async def test_an_event_past_the_limit_cuts_the_stream_and_charges_the_backend(
    make_stack: StackFactory, usage: bool
) -> None:
    stack = await make_stack(limits={"max_event_bytes": 1 << 20})
    body = chat(max_tokens=4, stream=True)
    if usage:
        body["stream_options"] = {"include_usage": True}
    async with httpx.AsyncClient(timeout=20) as client:
        r = await client.post(
            stack.base_url + "/v1/chat/completions", json=body, headers={"x-sim-fault": "huge_event=30000000"}
        )
    assert r.status_code == 200
    events = sse_events(r.content)
    assert "[DONE]" not in events
    assert "longer than 1048576 bytes" in events[-1] and '"upstream_error"' in events[-1]
    assert len(r.content) < 2 << 20  # relayed up to the limit, then cut: not the whole 30 MB
    assert stack.total("gateway_requests_total", outcome="upstream_error_midstream") == 1
    backend = next(b for b in stack.gateway.registry if b.name == "vllm-0")
    assert backend.consecutive_failures == 1
    sim = stack.sims["vllm-0"]
    await sim.wait_until(lambda s: s.active == 0)
    assert sim.stats.recent[-1].outcome == "aborted"  # the gateway hung up before the event's end


async def test_an_event_under_the_limit_is_relayed_whole(make_stack: StackFactory) -> None:
    stack = await make_stack(limits={"max_event_bytes": 4 << 20})
    async with httpx.AsyncClient(timeout=20) as client:
        r = await client.post(
            stack.base_url + "/v1/chat/completions",
            json=chat(max_tokens=3, stream=True),
            headers={"x-sim-fault": "huge_event=3000000"},
        )
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    assert max(len(e) for e in events) > 3_000_000
    assert stack.total("gateway_requests_total", outcome="success") == 1
