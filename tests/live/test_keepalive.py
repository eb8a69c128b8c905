"""A slow first token (long prefill) must not be timed out, and the client gets SSE comment
keep-alives meanwhile, so idle-timeout proxies in front do not cut it (docs/reliability.md item 4)."""

from __future__ import annotations

import httpx
import pytest

from tests.live.conftest import StackFactory, chat, content_of, sse_events

pytestmark = pytest.mark.live


async def test_pings_while_waiting_for_the_first_token(make_stack: StackFactory) -> None:
    stack = await make_stack(timeouts={"keepalive_s": 0.2, "idle_s": 5, "first_byte_s": 5})
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.post(
            stack.base_url + "/v1/chat/completions",
            json=chat(stream=True, max_tokens=3),
            headers={"x-sim-fault": "headers_delay=0;first_token_delay=1.0"},
        )
    assert r.status_code == 200
    assert r.content.count(b": ping\n\n") >= 3
    events = sse_events(r.content)
    assert events[-1] == "[DONE]" and content_of(events)
    assert stack.total("gateway_requests_total", outcome="success") == 1


async def test_first_token_may_take_longer_than_the_idle_gap(make_stack: StackFactory) -> None:
    """A long prefill is bounded by first_byte_s, not idle_s; past first_byte_s it is a TTFB timeout."""
    stack = await make_stack(timeouts={"keepalive_s": 0, "idle_s": 0.3, "first_byte_s": 3})
    async with httpx.AsyncClient(timeout=10) as client:
        ok = await client.post(
            stack.base_url + "/v1/chat/completions",
            json=chat(stream=True, max_tokens=2),
            headers={"x-sim-fault": "first_token_delay=0.8"},
        )
        late = await client.post(
            stack.base_url + "/v1/chat/completions",
            json=chat(stream=True, max_tokens=2),
            headers={"x-sim-fault": "first_token_delay=5"},
        )
    assert sse_events(ok.content)[-1] == "[DONE]"
    assert late.status_code == 504
    assert stack.total("gateway_requests_total", outcome="timeout_ttfb") == 1
