"""A context cap holds to the token (docs/reliability.md, "Exact caps"): when the gateway sets the
output budget (no length field) or clamps one too large, the engine's own prompt count plus that
budget is the cap exactly, never one over, for prompts built to be under-estimated (emoji, CJK,
code, long numbers), on chat, Messages and Responses, native and translated, against a REAL
llama-server (Responses translated to chat) and a REAL vLLM (all native)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.gateway_harness import GatewayThread, running_gateway

CAP = 400
PROMPTS = {
    "emoji": "😀🚀🎉" * 12,
    "cjk": "中文字符测试" * 10,
    "code": "def f(x):\n    return [i**2 for i in range(x) if i % 3 == 0]  # {}[]()\n" * 3,
    "numbers": "3141592653589793238462643383279502884197169399375105820974944 " * 4,
}
# (path, body without a length field, the field's name, where the usage keeps the prompt's count)
PROTOCOLS: dict[str, tuple[str, str, str]] = {
    "chat": ("/v1/chat/completions", "max_tokens", "prompt_tokens"),
    "messages": ("/v1/messages", "max_tokens", "input_tokens"),
    "responses": ("/v1/responses", "max_output_tokens", "input_tokens"),
}


def _body(api: str, route: str, text: str, length: int | None) -> dict[str, Any]:
    if api == "responses":
        body: dict[str, Any] = {"model": route, "input": text}
    else:
        body = {"model": route, "messages": [{"role": "user", "content": text}]}
    if length is not None:
        body[PROTOCOLS[api][1]] = length
    return body


@pytest.fixture(scope="module")
def gateway(llamacpp_server: Any, vllm_server: Any) -> Iterator[GatewayThread]:
    data = {
        "health": {"interval_s": 60, "scrape_interval_s": 60},
        "pools": {
            "llamacpp": {"engine": "llamacpp", "backends": [{"url": llamacpp_server.base_url, "model": "tiny"}]},
            "vllm": {"engine": "vllm", "backends": [{"url": vllm_server.base_url, "model": "tiny"}]},
        },
        "routes": [
            {"model": "llama", "pools": ["llamacpp"], "caps": {"max_context_tokens": CAP}},
            {"model": "vllm", "pools": ["vllm"], "caps": {"max_context_tokens": CAP}},
        ],
    }
    with running_gateway(data) as gw:
        yield gw


# Messages requires max_tokens: it is tested with a too-large one, clamped; the others both ways.
CASES = [(api, length) for api in PROTOCOLS for length in (None, 100_000) if not (api == "messages" and length is None)]


@pytest.mark.parametrize("script", list(PROMPTS))
@pytest.mark.parametrize(("api", "length"), CASES)
@pytest.mark.parametrize("route", ["llama", "vllm"])
def test_the_budget_the_gateway_sets_fills_the_cap_exactly(
    gateway: GatewayThread, route: str, api: str, length: int | None, script: str
) -> None:
    path, _, prompt_field = PROTOCOLS[api]
    r = httpx.post(gateway.base_url + path, json=_body(api, route, PROMPTS[script], length), timeout=300)
    assert r.status_code == 200, r.text
    header = "x-gateway-max-tokens" if length is None else "x-gateway-max-tokens-clamped"
    budget = int(r.headers[header])
    usage = r.json()["usage"]
    # Anthropic's input_tokens leaves out what came from the prompt cache (llama.cpp reuses its slot).
    cached = usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    prompt = usage[prompt_field] + (cached if api == "messages" else 0)
    assert prompt + budget == CAP, (prompt, budget)  # the engine's own count: exact, not one over
    assert usage.get("completion_tokens", usage.get("output_tokens")) <= budget
