"""A saturated pool shared between keys, against a simulated engine at a fixed capacity (one
backend, max_in_flight 2): an interactive key keeps a near-zero queue wait under a batch flood, and
flooding keys share the tokens by weight, not by how many requests each keeps in flight."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.live.conftest import Stack, StackFactory, chat, sim_params

pytestmark = pytest.mark.live

SLOTS = 4
MAX_TOKENS = 20
STEP_S = 0.005  # a request takes ~0.1 s: capacity ~40 requests/s, little CPU for the gateway


async def sharing_stack(make_stack: StackFactory, keys: list[dict[str, Any]]) -> Stack:
    stack = await make_stack(
        pools={"vllm": [sim_params(base_step_s=STEP_S)]}, keys=keys, limits={"queue_timeout_s": 20}
    )
    stack.gateway.registry.by_name["vllm-0"].max_in_flight = SLOTS
    return stack


async def flood(base: str, key: str, clients: int, done: list[tuple[str, int]], enough: int) -> None:
    """`clients` closed loops of requests, until `enough` requests (of every key) have ended; each
    ending appends (key, completion tokens) to `done`, in the order they end."""

    async def loop(client: httpx.AsyncClient) -> None:
        while len(done) < enough:
            r = await client.post(
                base + "/v1/chat/completions",
                json=chat(max_tokens=MAX_TOKENS),
                headers={"authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200, r.text
            done.append((key, r.json()["usage"]["completion_tokens"]))

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=clients)) as client:
        await asyncio.gather(*(loop(client) for _ in range(clients)))


async def test_interactive_key_is_not_queued_behind_a_batch_flood(make_stack: StackFactory) -> None:
    stack = await sharing_stack(
        make_stack,
        [
            {"name": "batch", "key": "sk-batch", "priority": "batch"},
            {"name": "chat", "key": "sk-chat", "priority": "interactive"},
        ],
    )
    done: list[tuple[str, int]] = []
    batch = asyncio.create_task(flood(stack.base_url, "sk-batch", 10 * SLOTS, done, 10**9))
    await asyncio.sleep(0.5)  # the batch key has filled the queue
    codes = []
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(10):  # ~10 requests/s: about a fifth of the capacity
            r = await client.post(
                stack.base_url + "/v1/chat/completions",
                json=chat(max_tokens=MAX_TOKENS),
                headers={"authorization": "Bearer sk-chat"},
            )
            codes.append(r.status_code)
            await asyncio.sleep(0.1)
    batch.cancel()
    await asyncio.gather(batch, return_exceptions=True)
    assert codes == [200] * 10
    chat_waits = stack.metric("gateway_class_queue_wait_seconds_sum", pool="vllm", priority="interactive", key="chat")
    assert stack.metric("gateway_class_queue_wait_seconds_count", pool="vllm", priority="interactive", key="chat") == 10
    batch_sum = stack.metric("gateway_class_queue_wait_seconds_sum", pool="vllm", priority="batch", key="batch")
    batch_count = stack.metric("gateway_class_queue_wait_seconds_count", pool="vllm", priority="batch", key="batch")
    # About a quarter of one request's time (~25 ms); FIFO behind 36 batch requests is ~0.9 s.
    assert chat_waits / 10 < 0.1
    assert chat_waits / 10 < (batch_sum / batch_count) / 4


@pytest.mark.parametrize(("weights", "clients", "expected"), [((1, 1), (12, 4), 1.0), ((2, 1), (8, 8), 2.0)])
async def test_flooding_keys_share_by_weight(
    make_stack: StackFactory, weights: tuple[float, float], clients: tuple[int, int], expected: float
) -> None:
    """1:1 weights with 3x the requests in flight on one key still share evenly; 2:1 weights with
    equal traffic share 2:1 (FIFO would give 3:1 and 1:1)."""
    stack = await sharing_stack(
        make_stack,
        [{"name": "a", "key": "sk-a", "weight": weights[0]}, {"name": "b", "key": "sk-b", "weight": weights[1]}],
    )
    done: list[tuple[str, int]] = []
    warm, measured = sum(clients), 60  # the first endings come from the first burst, before the queue filled
    await asyncio.gather(
        flood(stack.base_url, "sk-a", clients[0], done, warm + measured),
        flood(stack.base_url, "sk-b", clients[1], done, warm + measured),
    )
    assert stack.gateway.capacity.waiting("vllm") == 0
    served = {"sk-a": 0, "sk-b": 0}
    for key, tokens in done[warm : warm + measured]:
        served[key] += tokens
    assert served["sk-a"] / served["sk-b"] == pytest.approx(expected, rel=0.1)


async def test_reserved_slots_keep_a_slot_free_for_the_interactive_class(make_stack: StackFactory) -> None:
    """With one slot reserved for interactive, the batch flood never holds more than SLOTS - 1, and
    an interactive request finds the held slot free: it does not wait for a batch request to end."""
    stack = await make_stack(
        pools={"vllm": [sim_params(base_step_s=STEP_S)]},
        keys=[
            {"name": "batch", "key": "sk-batch", "priority": "batch"},
            {"name": "chat", "key": "sk-chat", "priority": "interactive"},
        ],
        limits={"queue_timeout_s": 20},
        sharing={"reserved": {"interactive": 1}},
    )
    backend = stack.gateway.registry.by_name["vllm-0"]
    backend.max_in_flight = SLOTS
    done: list[tuple[str, int]] = []
    batch = asyncio.create_task(flood(stack.base_url, "sk-batch", 10 * SLOTS, done, 10**9))
    peak = 0
    for _ in range(100):  # 0.5 s of the batch flood alone
        peak = max(peak, backend.in_flight)
        await asyncio.sleep(0.005)
    assert peak == SLOTS - 1
    assert stack.gateway.capacity.waiting("vllm") > 0  # the flood is queued: the pool is saturated for batch
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(10):
            r = await client.post(
                stack.base_url + "/v1/chat/completions",
                json=chat(max_tokens=MAX_TOKENS),
                headers={"authorization": "Bearer sk-chat"},
            )
            assert r.status_code == 200
            await asyncio.sleep(0.1)
    batch.cancel()
    await asyncio.gather(batch, return_exceptions=True)
    waits = stack.metric("gateway_class_queue_wait_seconds_sum", pool="vllm", priority="interactive", key="chat")
    # Without the reserve it waits for a batch request to end, ~25 ms on average (the test above).
    assert waits / 10 < 0.005
