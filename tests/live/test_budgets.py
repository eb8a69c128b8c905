"""Token budgets per key (docs/sharing.md, "Token budgets"): counted from the engine's reported
usage, refused with 429 in the client's protocol once used up (which budget, when it resets),
held while requests run so that concurrent requests on two replicas sharing a real redis-server
pass the budget by at most one request's tokens, and Redis gone follows redis.fail_open."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from gateway.config import ClientKeyConfig
from gateway.tools import keyscommand
from tests.live.conftest import Stack, StackFactory, chat
from tests.live.redis_server import RedisServer

pytestmark = pytest.mark.live

OUTPUT_BUDGET = 100
MAX_TOKENS = 12  # the simulator answers with exactly max_tokens tokens


def budget_key(**budget: Any) -> dict[str, Any]:
    return {"name": "team", "key": "sk-team", "budgets": [{"period": "day", **budget}]}


AUTH = {"authorization": "Bearer sk-team"}


async def spend(client: httpx.AsyncClient, stack: Stack) -> httpx.Response:
    return await client.post(stack.base_url + "/v1/chat/completions", json=chat(max_tokens=MAX_TOKENS), headers=AUTH)


async def test_the_output_budget_is_counted_from_usage_and_refused_past_it(make_stack: StackFactory) -> None:
    stack = await make_stack(keys=[budget_key(output_tokens=OUTPUT_BUDGET)])
    async with httpx.AsyncClient(timeout=10) as client:
        codes = []
        for _ in range(12):
            r = await spend(client, stack)
            codes.append(r.status_code)
            await asyncio.sleep(0.02)  # the spend is counted just after the answer
        # 100 tokens at 12 a request: 9 requests reach 108, the tenth is refused.
        assert codes == [200] * 9 + [429] * 3
        assert stack.metric("gateway_budget_used_tokens", key="team", period="day", kind="output") == 9 * MAX_TOKENS
        assert stack.metric("gateway_rate_limited_total", key="team", limit="budget_day") == 3
        body = r.json()["error"]
        assert body["code"] == "budget_exceeded" and body["type"] == "tokens"
        assert "daily output-token budget is used up: 108 of 100 tokens" in body["message"]
        assert 0 < int(r.headers["retry-after"]) <= 86_400
        # Anthropic's clients get their own shape for the same refusal.
        m = await client.post(
            stack.base_url + "/v1/messages",
            json={"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": "sk-team", "anthropic-version": "2023-06-01"},
        )
        assert m.status_code == 429
        assert m.json()["type"] == "error" and m.json()["error"]["type"] == "rate_limit_error"
        assert "budget" in m.json()["error"]["message"]


async def test_the_input_budget_counts_prompt_tokens(make_stack: StackFactory) -> None:
    stack = await make_stack(keys=[budget_key(input_tokens=30)])
    async with httpx.AsyncClient(timeout=10) as client:
        codes = []
        for _ in range(20):
            codes.append((await spend(client, stack)).status_code)
            await asyncio.sleep(0.02)
    used = stack.metric("gateway_budget_used_tokens", key="team", period="day", kind="input")
    served = codes.count(200)
    assert codes == [200] * served + [429] * (20 - served)
    assert 30 <= used < 30 + used / served + 1  # passed by at most one request's prompt


async def concurrent_spend(stacks: list[Stack], n: int) -> list[int]:
    async with httpx.AsyncClient(timeout=10) as client:
        responses = await asyncio.gather(*(spend(client, stacks[i % len(stacks)]) for i in range(n)))
    return [r.status_code for r in responses]


async def test_two_replicas_hold_one_budget_under_concurrency(
    make_stack: StackFactory, redis_server: RedisServer
) -> None:
    key = [budget_key(output_tokens=OUTPUT_BUDGET)]
    redis = {"url": redis_server.url, "timeout_s": 2.0}  # 40 at once on a busy 2-core machine: no fail-open
    a = await make_stack(keys=key, redis=redis)
    b = await make_stack(keys=key, redis=redis)
    codes = await concurrent_spend([a, b], 40)  # 40 at once, half on each replica
    await asyncio.sleep(0.2)
    served = codes.count(200)
    # Without holds every one of the 40 would see an unspent budget; with them, 100 / 12 -> 9.
    assert served == 9, codes
    assert set(codes) == {200, 429}
    store = Redis.from_url(redis_server.url)
    names = [n async for n in store.scan_iter("gateway:rl:{team}:budget:*:output")]
    assert len(names) == 1
    used = int(await store.get(names[0]) or 0)
    await store.aclose()
    assert OUTPUT_BUDGET <= used <= OUTPUT_BUDGET + MAX_TOKENS
    assert codes.count(429) == 31


async def test_redis_gone_follows_fail_open(make_stack: StackFactory, redis_server: RedisServer) -> None:
    key = [budget_key(output_tokens=2 * MAX_TOKENS)]
    open_ = await make_stack(keys=key, redis={"url": redis_server.url})
    closed = await make_stack(keys=key, redis={"url": redis_server.url, "fail_open": False})
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await spend(client, open_)).status_code == 200
        redis_server.stop()
        assert [(await spend(client, open_)).status_code for _ in range(4)] == [200] * 4  # unlimited
        r = await spend(client, closed)
    assert r.status_code == 503 and r.json()["error"]["code"] == "rate_limiter_unavailable"


async def test_gateway_keys_shows_the_spend_from_redis_and_from_metrics(
    make_stack: StackFactory, redis_server: RedisServer, tmp_path: Path
) -> None:
    key = budget_key(output_tokens=OUTPUT_BUDGET, input_tokens=10_000)
    shared = await make_stack(keys=[key], redis={"url": redis_server.url})
    alone = await make_stack(keys=[key])
    async with httpx.AsyncClient(timeout=10) as client:
        for stack in (shared, shared, alone):
            assert (await spend(client, stack)).status_code == 200
        await asyncio.sleep(0.1)
        page = (await client.get(alone.base_url + "/metrics")).text
    # The real command, on a config that names the same Redis: every replica's spend.
    config = tmp_path / "gateway.yaml"
    config.write_text(
        json.dumps(
            {
                "redis": {"url": redis_server.url},
                "keys": [key],
                "pools": {"p": {"engine": "vllm", "backends": [{"url": "http://127.0.0.1:9"}]}},
                "routes": [{"model": "tiny", "pools": ["p"]}],
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "keys", "--config", str(config), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    row = next(line for line in out.decode().splitlines() if line.startswith("team"))
    assert f"{2 * MAX_TOKENS} / {OUTPUT_BUDGET}" in row and "/ 10000" in row
    # Without Redis the spend is the serving gateway's own: read from its /metrics.
    spent = keyscommand.from_metrics(page)
    assert spent["team", "day"][1] == MAX_TOKENS
    assert f"{MAX_TOKENS} / {OUTPUT_BUDGET}" in keyscommand.render(
        (ClientKeyConfig.model_validate(key),), spent, 0, "x"
    )
