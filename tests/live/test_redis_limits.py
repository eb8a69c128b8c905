"""Per-key limits shared across gateway replicas through a real redis-server
(docs/configuration.md `redis`): two gateways with their own state (two apps in one process, and
two `gateway serve` processes) hold one limit between them; when Redis goes away they keep serving
(fail_open) or refuse limited keys (fail_open: false), and the limiter metrics say so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from engines.sim.server import SimServer
from tests.live.conftest import Stack, StackFactory, chat, fresh_minute, sim_params
from tests.live.redis_server import RedisServer
from tests.live.test_demo import free_port

pytestmark = pytest.mark.live

KEY = {"name": "team", "key": "sk-team", "requests_per_minute": 4}
AUTH = {"authorization": "Bearer sk-team"}


async def ask(client: httpx.AsyncClient, stack: Stack) -> int:
    r = await client.post(
        stack.base_url + "/v1/chat/completions", json=chat(max_tokens=1), headers={"authorization": "Bearer sk-team"}
    )
    return r.status_code


async def test_two_gateways_share_one_limit_and_fail_open_when_redis_dies(
    make_stack: StackFactory, redis_server: RedisServer
) -> None:
    a = await make_stack(keys=[KEY], redis={"url": redis_server.url})
    b = await make_stack(keys=[KEY], redis={"url": redis_server.url})
    assert a.gateway is not b.gateway
    await fresh_minute()
    async with httpx.AsyncClient(timeout=10) as client:
        codes = [await ask(client, a), await ask(client, b), await ask(client, a), await ask(client, b)]
        assert codes == [200, 200, 200, 200]
        # Four between them: each gateway alone would allow four more.
        assert [await ask(client, a), await ask(client, b)] == [429, 429]
        assert a.metric("gateway_limiter_backend_up", store="redis") == 1
        redis_server.stop()
        after = [await ask(client, a) for _ in range(3)] + [await ask(client, b)]
    assert after == [200, 200, 200, 200]  # fail open: serving, unlimited
    for stack in (a, b):
        assert stack.metric("gateway_limiter_backend_up", store="redis") == 0
        assert stack.metric("gateway_limiter_errors_total", store="redis") >= 1
    assert a.sims["vllm-0"].stats.seen == 5 and b.sims["vllm-0"].stats.seen == 3


async def test_fail_closed_refuses_limited_keys_but_serves_the_rest(
    make_stack: StackFactory, redis_server: RedisServer
) -> None:
    stack = await make_stack(
        keys=[KEY, {"name": "free", "key": "sk-free"}], redis={"url": redis_server.url, "fail_open": False}
    )
    async with httpx.AsyncClient(timeout=10) as client:
        assert await ask(client, stack) == 200
        redis_server.stop()
        url = stack.base_url + "/v1/chat/completions"
        refused = await client.post(url, json=chat(max_tokens=1), headers={"authorization": "Bearer sk-team"})
        free = await client.post(url, json=chat(max_tokens=1), headers={"authorization": "Bearer sk-free"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "rate_limiter_unavailable"
    assert refused.headers["retry-after"] == "1"
    assert free.status_code == 200
    assert stack.metric("gateway_limiter_backend_up", store="redis") == 0


async def test_tokens_counted_by_one_gateway_limit_the_other(
    make_stack: StackFactory, redis_server: RedisServer
) -> None:
    key = {"name": "tok", "key": "sk-tok", "tokens_per_minute": 30}
    a = await make_stack(keys=[key], redis={"url": redis_server.url, "key_prefix": "t:"})
    b = await make_stack(keys=[key], redis={"url": redis_server.url, "key_prefix": "t:"})
    auth = {"authorization": "Bearer sk-tok"}
    await fresh_minute()
    redis = Redis.from_url(redis_server.url)
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            first = await client.post(a.base_url + "/v1/chat/completions", json=chat(max_tokens=40), headers=auth)
            assert first.status_code == 200
            async with asyncio.timeout(5):  # the finished request's tokens are written in the background
                while not await redis.keys("t:{tok}:tokens:*"):
                    await asyncio.sleep(0.01)
            second = await client.post(b.base_url + "/v1/chat/completions", json=chat(max_tokens=1), headers=auth)
    finally:
        await redis.aclose()
    assert second.status_code == 429 and second.json()["error"]["type"] == "tokens"
    assert b.sims["vllm-0"].stats.seen == 0


async def test_two_gateway_processes_share_one_limit(redis_server: RedisServer, tmp_path: Path) -> None:
    """The same across two `gateway serve` processes, in front of one simulated engine."""
    async with SimServer(sim_params()) as sim:
        cfg = tmp_path / "g.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "pools": {"p": {"engine": "sim", "backends": [{"url": sim.base_url, "model": "tiny"}]}},
                    "routes": [{"model": "tiny", "pools": ["p"]}],
                    "keys": [KEY],
                    "redis": {"url": redis_server.url},
                }
            )
        )
        procs, urls = [], []
        try:
            for _ in range(2):
                port = free_port()
                cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)]
                procs.append(subprocess.Popen([*cmd, "--log-level", "warning"], stderr=subprocess.DEVNULL))
                urls.append(f"http://127.0.0.1:{port}")
            async with httpx.AsyncClient(timeout=10) as client:
                for url in urls:
                    async with asyncio.timeout(15):
                        while True:
                            with contextlib.suppress(httpx.TransportError):
                                if (await client.get(url + "/readyz")).status_code == 200:
                                    break
                            await asyncio.sleep(0.05)
                await fresh_minute()

                async def post(url: str) -> int:
                    r = await client.post(url + "/v1/chat/completions", json=chat(max_tokens=1), headers=AUTH)
                    return r.status_code

                codes = [await post(urls[i % 2]) for i in range(6)]
                assert codes == [200, 200, 200, 200, 429, 429]
                redis_server.stop()
                assert [await post(urls[0]), await post(urls[1])] == [200, 200]
                for url in urls:
                    text = (await client.get(url + "/metrics")).text
                    assert 'gateway_limiter_backend_up{store="redis"} 0.0' in text
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=15)
    assert [p.returncode for p in procs] == [0, 0]
    assert sim.stats.seen == 6
