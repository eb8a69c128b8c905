"""The balancer learns from what served (docs/design.md, "Learn from what served"): once, after the
first byte arrived, from the backend that answered. A retried request teaches the backend that
answered; a request the cap rejected, or that every backend refused, teaches nothing."""

from __future__ import annotations

import httpx
import pytest

from gateway.policy.balancer import PrefixAffinity
from tests.live.conftest import Stack, StackFactory, sim_params

pytestmark = pytest.mark.live

SYSTEM = {"role": "system", "content": "You are terse. " * 40}


def turn(conversation: int, turns: int) -> list[dict[str, str]]:
    """A conversation's messages up to its `turns`-th user message (several fingerprint blocks)."""
    messages = [SYSTEM]
    for t in range(turns):
        if t:
            messages.append({"role": "assistant", "content": f"answer {t} " * 60})
        messages.append({"role": "user", "content": f"conversation {conversation} question {t} " * 30})
    return messages


async def ask(stack: Stack, messages: list[dict[str, str]]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        body = {"model": "tiny", "messages": messages, "max_tokens": 2}
        return await client.post(stack.base_url + "/v1/chat/completions", json=body)


def affinity(stack: Stack) -> PrefixAffinity:
    balancer = stack.gateway.router.balancer("vllm")
    assert isinstance(balancer, PrefixAffinity)
    return balancer


async def test_a_retried_conversation_continues_where_it_was_served(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(), sim_params()]},
        pool_vllm={"balancer": "prefix_affinity"},
        timeouts={"connect_s": 1.0, "first_byte_s": 1.0},
    )
    stack.sims["vllm-0"].set_fault("status=500")
    # Find a conversation whose first choice is vllm-0: its first turn fails there before the first
    # byte and is retried onto vllm-1. (Rendezvous hashing makes this deterministic.)
    for conversation in range(20):
        retries = stack.total("gateway_retries_total")
        r = await ask(stack, turn(conversation, 1))
        assert r.status_code == 200 and r.headers["x-gateway-backend"] == "vllm-1"
        if stack.total("gateway_retries_total") > retries:
            break
    else:
        pytest.fail("no conversation's first choice was vllm-0")
    stack.sims["vllm-0"].set_fault("")
    # vllm-0 is well again, and is the conversation's cold-start choice; but vllm-1 served it.
    for turns in (2, 3):
        r = await ask(stack, turn(conversation, turns))
        assert r.status_code == 200
        assert r.headers["x-gateway-backend"] == "vllm-1", f"turn {turns} left the backend that served turn 1"
    assert stack.total("gateway_retries_total") == retries + 1


async def test_a_cap_rejected_request_changes_no_affinity(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(), sim_params()]},
        pool_vllm={"balancer": "prefix_affinity"},
        routes=[{"model": "tiny", "pools": ["vllm"], "caps": {"max_context_tokens": 512}}],
    )
    r = await ask(stack, turn(1, 3))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert len(affinity(stack)) == 0
    assert stack.total("gateway_requests_total", outcome="rejected_4xx") == 1
    r = await ask(stack, turn(1, 1))  # the conversation's first turn fits, and is learned
    assert r.status_code == 200 and len(affinity(stack)) > 0


async def test_a_request_refused_everywhere_teaches_nothing(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="status=500"), sim_params(fault="status=500")]},
        pool_vllm={"balancer": "prefix_affinity"},
    )
    r = await ask(stack, turn(1, 2))
    assert r.status_code == 502
    assert len(affinity(stack)) == 0
    for sim in stack.sims.values():
        sim.set_fault("")
    r = await ask(stack, turn(1, 2))
    assert r.status_code == 200
    assert len(affinity(stack)) > 0  # a served request is learned
