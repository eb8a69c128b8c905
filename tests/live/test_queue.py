"""Per-backend concurrency limits: requests past max_in_flight wait in a bounded FIFO queue
(gateway_queue_wait_seconds), and past max_queue or queue_timeout_s get 429 at once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.live.conftest import StackFactory, chat, sim_params

pytestmark = pytest.mark.live


async def burst(base: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=20) as client:
        return await asyncio.gather(
            *(client.post(base + "/v1/chat/completions", json=chat(max_tokens=150)) for _ in range(n))
        )


async def test_requests_queue_for_a_slot(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"vllm": [sim_params()]})
    stack.gateway.registry.by_name["vllm-0"].max_in_flight = 1
    replies = await burst(stack.base_url, 4)
    assert [r.status_code for r in replies] == [200] * 4
    assert stack.sims["vllm-0"].stats.completed == 4
    waits = stack.samples("gateway_queue_wait_seconds_sum")
    assert sum(v for _, v in waits) > 0.5  # 150 tokens take >= 0.15 s, so three waits add to >= 0.9 s
    assert stack.total("gateway_queue_wait_seconds_count") == 4


async def test_full_queue_is_429(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"vllm": [sim_params()]}, limits={"max_queue": 1})
    stack.gateway.registry.by_name["vllm-0"].max_in_flight = 1
    replies = await burst(stack.base_url, 4)
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 200, 429, 429]
    assert all("retry-after" in r.headers for r in replies if r.status_code == 429)
    assert stack.total("gateway_requests_total", outcome="overloaded") == 2


async def test_backends_discovered_through_dns(make_stack: StackFactory) -> None:
    """`discover: true`: the host name's addresses become the pool's backends (Kubernetes headless
    Services). `localhost` resolves to 127.0.0.1 here, where the simulated engine listens."""
    stack = await make_stack()
    sim = stack.sims["vllm-0"]
    from gateway.config_loader import parse_config
    from gateway.serving.server import start

    config = parse_config(
        {
            "pools": {
                "p": {
                    "engine": "sim",
                    "backends": [{"url": f"http://localhost:{sim.port}", "discover": True, "model": "tiny"}],
                }
            },
            "routes": [{"model": "tiny", "pools": ["p"]}],
        },
        env={},
    )
    running = await start(config)
    try:
        names = sorted(running.gateway.registry.by_name)
        assert "p-0-127.0.0.1" in names
        async with httpx.AsyncClient() as client:
            r = await client.post(running.base_url + "/v1/chat/completions", json=chat(max_tokens=1))
        assert r.status_code == 200 and r.headers["x-gateway-backend"] == "p-0-127.0.0.1"
    finally:
        await running.stop()
