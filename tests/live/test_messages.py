"""Anthropic Messages through the real pipeline (a real uvicorn in front of simulated engines), with the
official `anthropic` SDK as the client: native on `engine: sim` (the simulator serves /v1/messages as
vLLM does), translated to chat completions on a generic `engine: openai` backend (the same simulator,
driven as an OpenAI-compatible server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.live.conftest import StackFactory, fresh_minute, raw_request, sim_params

pytestmark = pytest.mark.live

MSG: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hello there"}]}


def sdk(base_url: str, key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=key, max_retries=0)


@pytest.mark.parametrize("engine", ["sim", "openai"])
async def test_sdk_non_stream_and_stream(make_stack: StackFactory, engine: str) -> None:
    extra = {} if engine == "sim" else {"pool_vllm": {"engine": "openai", "flavour": "vllm"}}
    stack = await make_stack(**extra)
    client = sdk(stack.base_url)
    message = await client.messages.create(
        system="be brief", **MSG, metadata={"user_id": "u1"}, extra_headers={"anthropic-beta": "b1"}
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8
    async with client.messages.stream(**MSG) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0
    await client.close()
    recent = list(stack.sims["vllm-0"].stats.recent)
    if engine == "sim":  # native: the client's bytes, unchanged
        assert [r.path for r in recent] == ["/v1/messages"] * 2
        assert recent[0].body["system"] == "be brief" and recent[0].body["metadata"] == {"user_id": "u1"}
    else:
        assert [r.path for r in recent] == ["/v1/chat/completions"] * 2
        assert recent[0].body["messages"][0] == {"role": "system", "content": "be brief"}
        assert recent[0].body["user"] == "u1"
    # Both lenses, on the Messages api label.
    assert stack.total("gateway_requests_total", outcome="success", api="messages") == 2
    assert stack.total("gateway_time_to_first_token_seconds_count") == 1
    assert (
        stack.total("gateway_output_tokens_total", source="usage")
        == message.usage.output_tokens + final.usage.output_tokens
    )


@pytest.mark.parametrize("engine", ["sim", "openai"])
async def test_count_tokens_equals_the_engines_count(make_stack: StackFactory, engine: str) -> None:
    extra = {} if engine == "sim" else {"pool_vllm": {"engine": "openai", "flavour": "vllm"}}
    stack = await make_stack(**extra)
    client = sdk(stack.base_url)
    counted = await client.messages.count_tokens(model="tiny", messages=MSG["messages"], system="be brief")
    await client.close()
    path = "/v1/messages/count_tokens" if engine == "sim" else "/v1/chat/completions"
    assert [r.path for r in stack.sims["vllm-0"].stats.recent] == [path]
    chat = {"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, *MSG["messages"]]}
    async with httpx.AsyncClient() as http:
        own = (await http.post(stack.sims["vllm-0"].base_url + "/tokenize", json=chat)).json()["count"]
    assert counted.input_tokens == own > 0


async def test_over_cap_is_an_anthropic_bad_request(make_stack: StackFactory) -> None:
    routes = [{"model": "tiny", "pools": ["vllm"], "caps": {"max_context_tokens": 64}}]
    stack = await make_stack(routes=routes)
    client = sdk(stack.base_url)
    try:
        with pytest.raises(anthropic.BadRequestError) as info:
            await client.messages.create(**{**MSG, "messages": [{"role": "user", "content": "word " * 400}]})
    finally:
        await client.close()
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "context length" in body["error"]["message"]  # OpenAI's phrase, kept
    # Counted exactly with the engine's tokenizer near the cap, and never sent for generation.
    assert [r.path for r in stack.sims["vllm-0"].stats.recent] == ["/tokenize"]
    assert stack.total("gateway_context_cap_total", action="rejected", method="exact") == 1


@pytest.mark.parametrize("engine", ["sim", "openai"])
async def test_clamps_max_tokens(make_stack: StackFactory, engine: str) -> None:
    routes = [{"model": "tiny", "pools": ["vllm"], "caps": {"max_tokens_limit": 3}}]
    extra = {} if engine == "sim" else {"pool_vllm": {"engine": "openai", "flavour": "vllm"}}
    stack = await make_stack(routes=routes, **extra)
    async with httpx.AsyncClient() as http:
        r = await http.post(stack.base_url + "/v1/messages", json={**MSG, "max_tokens": 50})
    assert r.status_code == 200 and r.headers["x-gateway-max-tokens-clamped"] == "3"
    assert list(stack.sims["vllm-0"].stats.recent)[-1].body["max_tokens"] == 3
    assert r.json()["usage"]["output_tokens"] <= 3


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({**MSG, "model": "nope"}, 404, "not_found_error"),
        ({k: v for k, v in MSG.items() if k != "max_tokens"}, 400, "invalid_request_error"),
        ({**MSG, "messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_request_error"),
    ],
)
async def test_errors_have_anthropics_shape(make_stack: StackFactory, body: Any, status: int, kind: str) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient() as http:
        r = await http.post(stack.base_url + "/v1/messages", json=body)
        bad = await http.post(stack.base_url + "/v1/messages", content=b"{not json")
    assert (r.status_code, r.json()["type"], r.json()["error"]["type"]) == (status, "error", kind)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


async def test_x_api_key_auth_and_headers(make_stack: StackFactory) -> None:
    stack = await make_stack(keys=[{"name": "a", "key": "sk-client-1"}])
    wrong = sdk(stack.base_url, "wrong")
    with pytest.raises(anthropic.AuthenticationError) as info:
        await wrong.messages.create(**MSG)
    await wrong.close()
    assert info.value.status_code == 401 and isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "authentication_error"
    client = sdk(stack.base_url, "sk-client-1")
    await client.messages.create(**MSG, extra_headers={"anthropic-beta": "tools-2024"})
    await client.close()
    async with httpx.AsyncClient() as http:  # the same key as a Bearer token, on another endpoint
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ok = await http.post(stack.base_url + "/v1/chat/completions", json=chat, headers={"x-api-key": "sk-client-1"})
        bearer = await http.post(
            stack.base_url + "/v1/messages", json=MSG, headers={"authorization": "Bearer sk-client-1"}
        )
    assert ok.status_code == 200 and bearer.status_code == 200
    sent = next(iter(stack.sims["vllm-0"].stats.recent)).headers
    assert sent.get("anthropic-version") and sent.get("anthropic-beta") == "tools-2024"
    assert "x-api-key" not in sent and "sk-client-1" not in json.dumps(dict(sent))


async def test_overload_is_529_overloaded_error_and_rate_limit_429(make_stack: StackFactory) -> None:
    stack = await make_stack(limits={"max_queue": 0}, keys=[{"name": "k", "key": "sk-k", "requests_per_minute": 2}])
    stack.gateway.registry.by_name["vllm-0"].max_in_flight = 1
    slow = {**MSG, "max_tokens": 200}
    headers = {"x-api-key": "sk-k"}
    await fresh_minute()
    async with httpx.AsyncClient(timeout=10) as http:
        first = asyncio.ensure_future(http.post(stack.base_url + "/v1/messages", json=slow, headers=headers))
        await stack.wait_metric("gateway_requests_in_flight", 1)
        over = await http.post(stack.base_url + "/v1/messages", json=MSG, headers=headers)
        await first
        limited = await http.post(stack.base_url + "/v1/messages", json=MSG, headers=headers)
    assert over.status_code == 529 and over.json()["error"]["type"] == "overloaded_error"
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limit_error"
    assert int(limited.headers["retry-after"]) >= 1


@pytest.mark.parametrize("engine", ["sim", "openai"])
async def test_client_leaving_a_stream_aborts_the_engine(make_stack: StackFactory, engine: str) -> None:
    extra = {} if engine == "sim" else {"pool_vllm": {"engine": "openai", "flavour": "vllm"}}
    stack = await make_stack(pools={"vllm": [sim_params(base_step_s=0.05)]}, **extra)
    body = json.dumps({**MSG, "max_tokens": 200, "stream": True}).encode()
    reader, writer = await raw_request(stack.base_url, "/v1/messages", body)
    seen = b""
    while b"content_block_delta" not in seen:
        seen += await reader.read(4096)
    assert b"event: message_start" in seen
    writer.close()
    sim = stack.sims["vllm-0"]
    await sim.wait_until(lambda s: s.active == 0, timeout=1)
    assert sim.stats.aborted == 1
    await stack.wait_metric("gateway_client_disconnects_total", 1, stage="mid_stream")


async def test_an_engine_that_refuses_after_opening_its_stream_gives_a_400(make_stack: StackFactory) -> None:
    """SGLang answers an over-long Messages stream with 200, message_start, then an error event (its
    recording: tests/fixtures/sglang/proto_messages_too_long_stream.sse.txt; the simulator does the
    same, each in its own write). The gateway looks past the preamble, so the client gets an HTTP 400."""
    stack = await make_stack(pools={"vllm": [sim_params("sglang", context_limit=64)]})
    client = sdk(stack.base_url)
    long = [{"role": "user", "content": "word " * 400}]
    try:
        with pytest.raises(anthropic.BadRequestError) as info:
            async with client.messages.stream(**{**MSG, "messages": long}) as stream:
                await stream.get_final_message()
    finally:
        await client.close()
    body = info.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    assert "context length" in body["error"]["message"]
    assert stack.total("gateway_requests_total", outcome="rejected_4xx", api="messages") == 1
