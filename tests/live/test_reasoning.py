"""`reasoning_content: copy` on a route, through the real pipeline: the answer and every stream chunk
that carries vLLM's `reasoning` get `reasoning_content` too; a route without it relays the bytes as the
engine sent them. The upstream is an emulator of a vLLM reasoning model (the tiny test model has no
think tokens, so no real vLLM reasoning parser can start on it); its shapes are vLLM 0.32's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.live.conftest import StackFactory, sse_events

pytestmark = pytest.mark.live

MESSAGE = {"role": "assistant", "content": "4", "reasoning": "2 and 2 make 4."}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    event = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "tiny"}
    event["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        answer = {"id": "chatcmpl-r", "object": "chat.completion", "created": 1, "model": "tiny"}
        answer["choices"] = [{"index": 0, "message": MESSAGE, "logprobs": None, "finish_reason": "stop"}]
        answer["usage"] = {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
        return web.json_response(answer)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for delta in ({"role": "assistant", "content": ""}, {"reasoning": "2 and 2"}, {"reasoning": " make 4."}):
        await resp.write(_chunk(delta))
    await resp.write(_chunk({"content": "4"}, "stop"))
    usage = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "tiny", "choices": []}
    usage["usage"] = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    await resp.write(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n")
    return resp


async def _health(request: web.Request) -> web.Response:
    return web.json_response({})


@pytest.fixture
async def reasoning_engine() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/health", _health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_reasoning_content_copy_per_route(make_stack: StackFactory, reasoning_engine: str) -> None:
    routes = [
        {"model": "think", "pools": ["vllm"], "reasoning_content": "copy"},
        {"model": "plain", "pools": ["vllm"]},
    ]
    stack = await make_stack(pools={"vllm": [reasoning_engine]}, routes=routes, pool_vllm={"engine": "vllm"})
    chat = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 8}
    async with httpx.AsyncClient(timeout=10) as http:
        url = stack.base_url + "/v1/chat/completions"
        copied = (await http.post(url, json={**chat, "model": "think"})).json()
        plain = (await http.post(url, json={**chat, "model": "plain"})).json()
        streamed = await http.post(url, json={**chat, "model": "think", "stream": True})
        raw_stream = await http.post(url, json={**chat, "model": "plain", "stream": True})
    message = copied["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "2 and 2 make 4."
    assert "reasoning_content" not in plain["choices"][0]["message"]
    events = [json.loads(e) for e in sse_events(streamed.content) if e != "[DONE]"]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    thinking = [d for d in deltas if "reasoning" in d]
    assert len(thinking) == 2 and all(d["reasoning_content"] == d["reasoning"] for d in thinking)
    assert sse_events(streamed.content)[-1] == "[DONE]"
    assert not any("usage" in e and not e["choices"] for e in events)  # the gateway's own usage ask stays hidden
    plain_deltas = [json.loads(e)["choices"][0]["delta"] for e in sse_events(raw_stream.content) if e != "[DONE]"]
    assert not any("reasoning_content" in d for d in plain_deltas)
    assert stack.total("gateway_output_tokens_total", route="think", source="usage") == 6 + 4
