"""A REAL llama-server behind the gateway, attacked as docs/reliability.md's defects 2,
5 and 6 describe: its HTTP 500s for client mistakes are 400s that never eject it; non-ASCII prompts over the
cap are rejected before it (by its own tokenizer's count); its `n_predict` obeys max_tokens_limit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.gateway_harness import GatewayThread, engine_metric, running_gateway

USER = [{"role": "user", "content": "hi"}]
# Bodies llama-server answers with HTTP 500, though each is the client's mistake.
MISTAKES = {
    "tools": json.dumps({"model": "llama", "messages": USER, "tools": [{"type": "function"}], "max_tokens": 2}),
    "seed": '{"model":"llama","messages":[{"role":"user","content":"hi"}],"seed":1e400,"max_tokens":2}',
    "image": json.dumps(
        {
            "model": "llama",
            "max_tokens": 2,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]}
            ],
        }
    ),
}


@pytest.fixture(scope="module")
def gateway(llamacpp_server: Any) -> Iterator[GatewayThread]:
    data = {
        "health": {"interval_s": 60, "scrape_interval_s": 60},
        "pools": {"llamacpp": {"engine": "llamacpp", "backends": [{"url": llamacpp_server.base_url, "model": "tiny"}]}},
        "routes": [
            {"model": "llama", "pools": ["llamacpp"]},
            # One route per script, so that neither test's traffic teaches the other's estimate.
            {"model": "llama-capped-emoji", "pools": ["llamacpp"], "caps": {"max_context_tokens": 256}},
            {"model": "llama-capped-cjk", "pools": ["llamacpp"], "caps": {"max_context_tokens": 256}},
            {"model": "llama-limited", "pools": ["llamacpp"], "caps": {"max_tokens_limit": 8}},
        ],
    }
    with running_gateway(data) as gw:
        yield gw


def post(gateway: GatewayThread, body: str | dict[str, Any]) -> httpx.Response:
    raw = body if isinstance(body, str) else json.dumps(body)
    headers = {"content-type": "application/json"}
    return httpx.post(gateway.base_url + "/v1/chat/completions", content=raw, headers=headers, timeout=120)


def test_llamacpps_500s_for_client_mistakes_are_400s_and_never_eject_it(gateway: GatewayThread) -> None:
    """Defect 2: six of them (each answered 500 by llama-server); the backend stays in, /readyz ready."""
    for name in [*MISTAKES, *MISTAKES]:
        r = post(gateway, MISTAKES[name])
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error", name
    backend = next(iter(gateway.gateway.registry))
    assert backend.healthy and backend.consecutive_failures == 0
    assert gateway.metric("gateway_upstream_errors_total") == 0
    assert gateway.metric("gateway_retries_total") == 0
    assert post(gateway, {"model": "llama", "messages": USER, "max_tokens": 2}).status_code == 200
    ready = httpx.get(gateway.base_url + "/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["healthy_backends"] == 1


@pytest.mark.parametrize(("script", "text"), [("emoji", "😀" * 100), ("cjk", "中文字" * 40)])
def test_non_ascii_prompts_over_the_cap_never_reach_it(gateway: GatewayThread, script: str, text: str) -> None:
    """Defect 5: ~400 and ~360 tokens by llama-server's own tokenizer (emoji 4, CJK 3 a character),
    far more than a per-character estimate says, under a 256-token cap: rejected before the engine."""
    backend = next(iter(gateway.gateway.registry))
    tokens = httpx.post(backend.url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    assert len(tokens) > 256  # the real count is over the cap
    metrics_url = backend.url + "/metrics"
    before = engine_metric(metrics_url, "llamacpp:prompt_tokens_total")
    route = f"llama-capped-{script}"
    r = post(gateway, {"model": route, "messages": [{"role": "user", "content": text}], "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert engine_metric(metrics_url, "llamacpp:prompt_tokens_total") == before
    assert gateway.metric("gateway_context_cap_total", route=route, action="rejected", method="exact") >= 1
    short = text[: len(text) // 4]  # well under the cap: still served
    ok = post(gateway, {"model": route, "messages": [{"role": "user", "content": short}], "max_tokens": 4})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("fields", [{"n_predict": 50}, {"n_predict": 50, "max_tokens": 4}, {"n_predict": -1}])
def test_n_predict_obeys_max_tokens_limit(gateway: GatewayThread, fields: dict[str, int]) -> None:
    """Defect 6: llama-server generated 50 tokens for n_predict 50 under a limit of 8."""
    body = {"model": "llama-limited", "messages": USER, "ignore_eos": True, **fields}
    r = post(gateway, body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    header = "x-gateway-max-tokens" if fields == {"n_predict": -1} else "x-gateway-max-tokens-clamped"
    assert r.headers[header] == "8"
