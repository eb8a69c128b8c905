"""Context caps and routing, end to end against simulated engines: a prompt over the cap never
reaches a backend, max_tokens is clamped or defaulted, truncate_oldest keeps the system prompt,
and workload rules send traffic to the right pool with headers that say why."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.live.conftest import StackFactory, chat, sim_params

pytestmark = pytest.mark.live

CAPPED: list[dict[str, Any]] = [
    {
        "model": "tiny",
        "pools": ["vllm"],
        "caps": {"max_context_tokens": 512, "default_max_tokens": 64, "max_tokens_limit": 256},
    }
]


async def post(base: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(base + "/v1/chat/completions", json=body)


async def test_over_cap_is_rejected_before_the_backend(make_stack: StackFactory) -> None:
    stack = await make_stack(routes=CAPPED)
    client = openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 2000}])
    await client.close()
    assert info.value.code == "context_length_exceeded"
    message = str(info.value)
    assert "512" in message
    sim = stack.sims["vllm-0"]
    assert all(r.path != "/v1/chat/completions" for r in sim.stats.recent)  # only /tokenize was asked
    assert stack.total("gateway_context_cap_total", action="rejected", method="exact") == 1


async def test_max_tokens_clamped_and_defaulted(make_stack: StackFactory) -> None:
    stack = await make_stack(routes=CAPPED)
    r = await post(stack.base_url, chat(max_tokens=10_000))
    assert r.status_code == 200
    assert r.headers["x-gateway-max-tokens-clamped"] == "256"
    assert r.json()["usage"]["completion_tokens"] == 256
    r = await post(stack.base_url, chat(content="word " * 350))  # ~440 tokens: the cap leaves < 64
    assert r.status_code == 200
    sent = stack.sims["vllm-0"].stats.recent[-1].body["max_tokens"]
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + sent <= 512
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = await post(stack.base_url, chat(content="hi"))
    assert r.headers["x-gateway-max-tokens"] == "64"


async def test_truncate_oldest_keeps_system_and_last_user(make_stack: StackFactory) -> None:
    routes = [{**CAPPED[0], "caps": {**CAPPED[0]["caps"], "on_exceed": "truncate_oldest"}}]
    stack = await make_stack(routes=routes)
    history = [{"role": "system", "content": "be brief"}]
    for i in range(12):
        history += [
            {"role": "user", "content": f"question {i} " + "word " * 60},
            {"role": "assistant", "content": "answer " * 60},
        ]
    history.append({"role": "user", "content": "final question"})
    r = await post(stack.base_url, {"model": "tiny", "messages": history, "max_tokens": 8})
    assert r.status_code == 200
    dropped = int(r.headers["x-gateway-truncated-messages"])
    sent = stack.sims["vllm-0"].stats.recent[-1].body["messages"]
    assert len(sent) == len(history) - dropped and dropped > 0
    assert sent[0] == history[0] and sent[-1] == history[-1]
    assert r.json()["usage"]["prompt_tokens"] + 8 <= 512


async def test_engine_context_errors_are_normalised(make_stack: StackFactory) -> None:
    """A request the gateway let through (no cap configured) that the engine rejects as too long
    reaches the client as the same 400 context_length_exceeded, for every flavour."""
    for flavour in ("vllm", "sglang", "llamacpp"):
        stack = await make_stack(
            pools={"p": [sim_params(flavour, context_limit=64)]}, routes=[{"model": "tiny", "pools": ["p"]}]
        )
        r = await post(stack.base_url, chat(content="word " * 400))
        assert r.status_code == 400, (flavour, r.text)
        assert r.json()["error"]["code"] == "context_length_exceeded", flavour


AGENT_ROUTES = [
    {
        "model": "tiny",
        "pools": ["vllm", "sglang", "llamacpp"],
        "rules": [
            {"name": "mac", "when": {"platform": "mac"}, "pool": "llamacpp"},
            {"name": "agent", "when": {"shared_prefix": True}, "pool": "sglang"},
            {"name": "default", "pool": "vllm"},
        ],
    }
]
SHARED = {"routing": {"shared_prefix": {"min_seen": 2, "min_prefix_chars": 256, "block_chars": 64}}}


def agent_turn(turn: int) -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are a tool-using agent. " * 30}]
    for t in range(turn):
        messages += [{"role": "user", "content": f"step {t}"}, {"role": "assistant", "content": f"did {t}"}]
    messages.append({"role": "user", "content": f"step {turn}"})
    return {
        "model": "tiny",
        "messages": messages,
        "max_tokens": 2,
        "tools": [{"type": "function", "function": {"name": "search", "parameters": {}}}],
    }


async def test_agent_traffic_goes_to_sglang_and_chat_to_vllm(make_stack: StackFactory) -> None:
    pools = {"vllm": [sim_params()], "sglang": [sim_params("sglang")], "llamacpp": [sim_params("llamacpp")]}
    stack = await make_stack(pools=pools, routes=AGENT_ROUTES, **SHARED)
    seen = [(await post(stack.base_url, agent_turn(t))).headers for t in range(4)]
    assert [h["x-gateway-pool"] for h in seen[1:]] == ["sglang"] * 3
    assert all(h["x-gateway-rule"] == "agent" for h in seen[1:])
    for i in range(3):
        r = await post(stack.base_url, chat(content=f"one-off question number {i} " * 3, max_tokens=1))
        assert r.headers["x-gateway-pool"] == "vllm" and r.headers["x-gateway-rule"] == "default"
    assert stack.total("gateway_route_decisions_total", pool="sglang", rule="agent") == 3


async def test_mac_override_sends_everything_to_llamacpp(make_stack: StackFactory) -> None:
    pools = {"vllm": [sim_params()], "sglang": [sim_params("sglang")], "llamacpp": [sim_params("llamacpp")]}
    stack = await make_stack(pools=pools, routes=AGENT_ROUTES, platform="mac", **SHARED)
    for t in range(3):
        assert (await post(stack.base_url, agent_turn(t))).headers["x-gateway-pool"] == "llamacpp"
    assert (await post(stack.base_url, chat(max_tokens=1))).headers["x-gateway-rule"] == "mac"


async def test_fallback_pool_when_the_chosen_one_is_down(make_stack: StackFactory) -> None:
    pools = {"vllm": ["http://127.0.0.1:9"], "sglang": [sim_params("sglang")], "llamacpp": [sim_params("llamacpp")]}
    stack = await make_stack(pools=pools, routes=AGENT_ROUTES, **SHARED)
    r = await post(stack.base_url, chat(max_tokens=1))
    assert r.status_code == 200
    assert r.headers["x-gateway-pool"] == "sglang" and r.headers["x-gateway-rule"] == "fallback:sglang"


async def test_prompt_size_rules_see_the_estimate(make_stack: StackFactory) -> None:
    pools = {"small": [sim_params()], "big": [sim_params()]}
    routes = [
        {
            "model": "tiny",
            "pools": ["small", "big"],
            "rules": [
                {"name": "long", "when": {"min_prompt_tokens": 200}, "pool": "big"},
                {"name": "short", "pool": "small"},
            ],
        }
    ]
    stack = await make_stack(pools=pools, routes=routes)
    assert (await post(stack.base_url, chat(content="word " * 400, max_tokens=1))).headers["x-gateway-rule"] == "long"
    assert (await post(stack.base_url, chat(content="hi", max_tokens=1))).headers["x-gateway-rule"] == "short"
