"""Anthropic Messages through the gateway in front of a real llama.cpp, vLLM and SGLang, with the
official `anthropic` SDK as the client (its base_url = the gateway): native on each engine (their
tables list "messages" and "count_tokens"), and translated to chat on the same engine reached as a
generic `engine: openai` backend. Over-cap requests, engine errors and auth in Anthropic's shape;
a client leaving a Messages stream frees the engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam

from tests.integration.gateway_harness import (
    GatewayThread,
    leave_mid_stream,
    llamacpp_frees_when_left,
    running_gateway,
    vllm_frees_when_left,
    wait_for,
)

KEY = "sk-messages-client"
ENGINES = ("llamacpp", "vllm", "sglang")
PROMPT: list[MessageParam] = [{"role": "user", "content": "Say something about the gateway."}]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture(scope="module")
def gateway(engine: Any) -> Iterator[GatewayThread]:
    url = engine.base_url
    data = {
        "health": {"interval_s": 2, "scrape_interval_s": 60},
        "keys": [{"name": "c", "key": KEY}],
        "pools": {
            "native": {"engine": engine.kind, "backends": [{"url": url, "model": "tiny"}]},
            "generic": {"engine": "openai", "backends": [{"url": url, "model": "tiny"}]},
        },
        "routes": [
            {"model": "native", "pools": ["native"], "caps": {"max_context_tokens": engine.max_context}},
            {"model": "generic", "pools": ["generic"], "caps": {"max_context_tokens": engine.max_context}},
            {"model": "raw", "pools": ["native"]},
        ],
    }
    with running_gateway(data) as gw:
        wait_for(lambda: gw.metric("gateway_backend_up") == 2, 30)
        yield gw


def client(gw: GatewayThread, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.base_url, api_key=key, max_retries=0, timeout=120)


@pytest.mark.parametrize("route", ["native", "generic"])
def test_non_stream_and_stream(gateway: GatewayThread, engine: Any, route: str) -> None:
    with client(gateway) as c:
        _non_stream_and_stream(gateway, c, route)


def _non_stream_and_stream(gateway: GatewayThread, c: anthropic.Anthropic, route: str) -> None:
    raw = c.messages.with_raw_response.create(model=route, max_tokens=8, system="You are a test.", messages=PROMPT)
    message = raw.parse()
    assert raw.headers["x-gateway-pool"] == route
    assert message.type == "message" and message.content[0].type == "text"
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8
    before = gateway.metric("gateway_time_to_first_token_seconds_count", api="messages")
    with c.messages.stream(model=route, max_tokens=8, messages=PROMPT) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.usage.output_tokens > 0
    assert gateway.metric("gateway_time_to_first_token_seconds_count", api="messages") == before + 1
    assert gateway.metric("gateway_output_tokens_total", api="messages", route=route, source="usage") >= (
        message.usage.output_tokens + final.usage.output_tokens
    )


@pytest.mark.parametrize("route", ["native", "generic"])
def test_count_tokens_equals_the_engines(gateway: GatewayThread, engine: Any, route: str) -> None:
    body = {"model": "tiny", "system": "You are a test.", "messages": PROMPT}
    own = httpx.post(engine.base_url + "/v1/messages/count_tokens", json=body, timeout=30).json()["input_tokens"]
    with client(gateway) as c:
        counted = c.messages.count_tokens(model=route, system="You are a test.", messages=PROMPT)
    assert counted.input_tokens == own > 0


@pytest.mark.parametrize("route", ["native", "generic"])
def test_over_cap_is_an_anthropic_bad_request(gateway: GatewayThread, engine: Any, route: str) -> None:
    long: list[MessageParam] = [{"role": "user", "content": "word " * (engine.max_context * 2)}]
    with client(gateway) as c, pytest.raises(anthropic.BadRequestError) as info:
        c.messages.create(model=route, max_tokens=8, messages=long)
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "context length" in body["error"]["message"]


def test_engine_context_error_is_normalised(gateway: GatewayThread, engine: Any) -> None:
    """No cap on the route: the engine itself refuses, and its error (vLLM's "BadRequestError",
    llama.cpp's OpenAI-shaped one) reaches the client in Anthropic's shape."""
    long: list[MessageParam] = [{"role": "user", "content": "word " * (engine.max_context * 2)}]
    for stream in (False, True):
        with client(gateway) as c, pytest.raises(anthropic.BadRequestError) as info:
            if stream:
                with c.messages.stream(model="raw", max_tokens=8, messages=long) as s:
                    s.get_final_message()
            else:
                c.messages.create(model="raw", max_tokens=8, messages=long)
        body = info.value.body
        assert isinstance(body, dict) and body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error"
        assert "context" in body["error"]["message"].lower()


def test_auth_by_x_api_key(gateway: GatewayThread) -> None:
    with client(gateway, "sk-wrong") as wrong, pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model="native", max_tokens=2, messages=PROMPT)
    assert isinstance(info.value.body, dict) and info.value.body["error"]["type"] == "authentication_error"
    with client(gateway) as c, pytest.raises(anthropic.NotFoundError) as missing:
        c.messages.create(model="nope", max_tokens=2, messages=PROMPT)
    assert isinstance(missing.value.body, dict) and missing.value.body["error"]["type"] == "not_found_error"


GO_ON = [{"role": "user", "content": "go on"}]


def stream_then_leave(gw: GatewayThread, model: str, max_tokens: int, extra: dict[str, Any], busy: Any) -> None:
    """Start a long Messages stream through the gateway, read a few events, then vanish."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "messages": GO_ON}
    got = leave_mid_stream(gw, "/v1/messages", body | extra, b"content_block_delta", busy, f"x-api-key: {KEY}\r\n")
    assert b"event: message_start" in got and b"message_stop" not in got


def test_leaving_a_messages_stream_frees_the_llamacpp_slot(engine_launcher: Any) -> None:
    def data(url: str) -> dict[str, Any]:
        return {
            "keys": [{"name": "c", "key": KEY}],
            "pools": {"p": {"engine": "llamacpp", "backends": [{"url": url, "model": "tiny"}]}},
            "routes": [{"model": "big", "pools": ["p"]}],
        }

    def leave(gw: GatewayThread) -> None:
        stream_then_leave(gw, "big", 8000, {"ignore_eos": True}, None)

    llamacpp_frees_when_left(engine_launcher, data, leave, api="messages")


def test_leaving_a_messages_stream_frees_the_vllm_request(vllm_long_server: Any, engine_launcher: Any) -> None:
    """As the chat test (test_real_engines.py). vLLM's Messages has no ignore_eos; greedy decoding
    of the random tiny model does not stop."""

    def data(url: str) -> dict[str, Any]:
        return {
            "keys": [{"name": "c", "key": KEY}],
            "pools": {"p": {"engine": "vllm", "backends": [{"url": url, "model": "tiny"}]}},
            "routes": [{"model": "long", "pools": ["p"]}],
        }

    def leave(gw: GatewayThread) -> None:
        stream_then_leave(gw, "long", 4000, {"temperature": 0}, lambda: True)

    vllm_frees_when_left(vllm_long_server, engine_launcher, data, leave, 4000, api="messages")
