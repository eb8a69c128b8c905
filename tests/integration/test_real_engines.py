"""The gateway in front of a REAL llama-server and a REAL vLLM (CPU builds, tiny generated models),
driven by the official openai client: chat and completions, stream and not, include_usage, context
caps before the engine, engines' own errors normalised, and disconnects that free the engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.gateway_harness import (
    GatewayThread,
    engine_metric,
    leave_mid_stream,
    llamacpp_frees_when_left,
    running_gateway,
    vllm_frees_when_left,
    wait_for,
)

IGNORE_EOS = {"ignore_eos": True}  # random weights: never stop early, so "length" is deterministic


@pytest.fixture(scope="module")
def gateway(llamacpp_server: Any, vllm_server: Any) -> Iterator[GatewayThread]:
    data = {
        "health": {"interval_s": 2, "scrape_interval_s": 1},
        "pools": {
            "llamacpp": {"engine": "llamacpp", "backends": [{"url": llamacpp_server.base_url, "model": "tiny"}]},
            "vllm": {"engine": "vllm", "backends": [{"url": vllm_server.base_url, "model": "tiny"}]},
            # The same engines, their windows not discovered: the raw routes' prompts reach the engine.
            "llamacpp-raw": {
                "engine": "llamacpp",
                "backends": [{"url": llamacpp_server.base_url, "model": "tiny", "discover_models": False}],
            },
            "vllm-raw": {
                "engine": "vllm",
                "backends": [{"url": vllm_server.base_url, "model": "tiny", "discover_models": False}],
            },
        },
        "routes": [
            {
                "model": "llama",
                "pools": ["llamacpp"],
                "caps": {"max_context_tokens": llamacpp_server.max_context, "default_max_tokens": 16},
            },
            {
                "model": "vllm",
                "pools": ["vllm"],
                "caps": {"max_context_tokens": vllm_server.max_context, "default_max_tokens": 16},
            },
            {
                "model": "llama-trunc",
                "pools": ["llamacpp"],
                "caps": {"max_context_tokens": 256, "on_exceed": "truncate_oldest", "default_max_tokens": 8},
            },
            {
                "model": "vllm-trunc",
                "pools": ["vllm"],
                "caps": {"max_context_tokens": 256, "on_exceed": "truncate_oldest", "default_max_tokens": 8},
            },
            {"model": "llama-raw", "pools": ["llamacpp-raw"]},
            {"model": "vllm-raw", "pools": ["vllm-raw"]},
        ],
    }
    with running_gateway(data) as gw:
        yield gw


@pytest.fixture
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="client-key", max_retries=0, timeout=120)
    yield c
    c.close()


ENGINES = ["llama", "vllm"]


@pytest.mark.parametrize("model", ENGINES)
def test_chat_non_stream(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello there"}], max_tokens=6, extra_body=IGNORE_EOS
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 0


@pytest.mark.parametrize("model", ENGINES)
def test_chat_stream_with_usage(client: openai.OpenAI, gateway: GatewayThread, model: str) -> None:
    before = gateway.metric("gateway_output_tokens_total", route=model, source="usage")
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "tell me"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IGNORE_EOS,
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    # The client can see [DONE] a moment before the gateway's finish step has counted it.
    wait_for(lambda: gateway.metric("gateway_output_tokens_total", route=model, source="usage") == before + 8, 5)


@pytest.mark.parametrize("model", ENGINES)
def test_chat_stream_without_usage_is_still_counted(client: openai.OpenAI, gateway: GatewayThread, model: str) -> None:
    before = gateway.metric("gateway_output_tokens_total", route=model, source="usage")
    chunks = list(
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "go"}], max_tokens=5, stream=True, extra_body=IGNORE_EOS
        )
    )
    assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for is stripped
    wait_for(lambda: gateway.metric("gateway_output_tokens_total", route=model, source="usage") == before + 5, 5)


@pytest.mark.parametrize("model", ENGINES)
@pytest.mark.parametrize("stream", [False, True])
def test_completions(client: openai.OpenAI, model: str, stream: bool) -> None:
    if stream:
        chunks = list(
            client.completions.create(
                model=model, prompt="once upon a time", max_tokens=4, stream=True, extra_body=IGNORE_EOS
            )
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        r = client.completions.create(model=model, prompt="once upon a time", max_tokens=4, extra_body=IGNORE_EOS)
        assert r.usage is not None and r.usage.completion_tokens == 4


@pytest.mark.parametrize("model", ["llama", "vllm", "llama-raw", "vllm-raw"])
@pytest.mark.parametrize("stream", [False, True])
def test_over_long_prompt_is_context_length_exceeded(client: openai.OpenAI, model: str, stream: bool) -> None:
    """Capped routes stop it in the gateway; raw routes pass it to the engine, whose own error
    (vLLM's, llama.cpp's exceed_context_size_error) is normalised to the same body."""
    with pytest.raises(openai.BadRequestError) as info:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "word " * 3000}], max_tokens=4, stream=stream
        )
        if stream:
            list(r)
    assert info.value.code == "context_length_exceeded"
    assert info.value.status_code == 400


@pytest.mark.parametrize(
    ("model", "counter"), [("llama", "llamacpp:prompt_tokens_total"), ("vllm", "vllm:prompt_tokens_total")]
)
def test_over_cap_never_reaches_the_engine(
    client: openai.OpenAI, gateway: GatewayThread, model: str, counter: str
) -> None:
    server = {"llama": "llamacpp", "vllm": "vllm"}[model]
    backend = next(iter(gateway.gateway.registry.pools[server]))
    metrics_url = backend.url + "/metrics"
    before = engine_metric(metrics_url, counter)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "word " * 3000}])
    assert engine_metric(metrics_url, counter) == before
    assert gateway.metric("gateway_context_cap_total", route=model, action="rejected") >= 1


@pytest.mark.parametrize("model", ENGINES)
def test_just_under_the_cap_passes_and_clamps(client: openai.OpenAI, gateway: GatewayThread, model: str) -> None:
    cap = gateway.config.route_for(model).caps.max_context_tokens  # type: ignore[union-attr]
    assert cap is not None
    # Find a prompt a little under the cap, measured by the engine itself.
    words = 40
    while True:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "word " * words}], max_tokens=1, extra_body=IGNORE_EOS
        )
        assert r.usage is not None
        if r.usage.prompt_tokens > cap - 64:
            break
        words = int(words * (cap - 40) / r.usage.prompt_tokens)
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "word " * words}], max_tokens=10_000, extra_body=IGNORE_EOS
    )
    reply = raw.parse()
    assert raw.headers["x-gateway-max-tokens-clamped"]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= cap


@pytest.mark.parametrize("model", ["llama-trunc", "vllm-trunc"])
def test_truncate_oldest_fits_and_keeps_the_system_prompt(client: openai.OpenAI, model: str) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": "SYSTEM RULES: be brief"}]
    for i in range(10):
        messages += [
            {"role": "user", "content": f"question {i} " + "word " * 30},
            {"role": "assistant", "content": "answer " * 30},
        ]
    messages.append({"role": "user", "content": "last question"})
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        extra_body=IGNORE_EOS,
    )
    reply = raw.parse()
    dropped = int(raw.headers["x-gateway-truncated-messages"])
    assert 0 < dropped < len(messages) - 2
    assert reply.usage is not None and reply.usage.prompt_tokens + 4 <= 256


def stream_then_leave(gw: GatewayThread, model: str, max_tokens: int, engine_busy: Any) -> None:
    """Start a long chat stream through the gateway, check the engine is working on it, then vanish."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True, "messages": GO_ON}
    leave_mid_stream(gw, "/v1/chat/completions", body, b"data: ", engine_busy)


GO_ON = [{"role": "user", "content": "go on"}]


def test_disconnect_frees_the_llamacpp_slot(engine_launcher: Any) -> None:
    def data(url: str) -> dict[str, Any]:
        return {
            "pools": {"p": {"engine": "llamacpp", "backends": [{"url": url, "model": "tiny"}]}},
            "routes": [{"model": "big", "pools": ["p"]}],
        }

    llamacpp_frees_when_left(engine_launcher, data, lambda gw: stream_then_leave(gw, "big", 8000, None))


def test_disconnect_frees_the_vllm_request(vllm_long_server: Any, engine_launcher: Any) -> None:
    """A long context of its own, so that the generation outlasts the disconnect: 4,000 tokens take
    this engine seconds; the client leaves after three events, tens of milliseconds in."""

    def data(url: str) -> dict[str, Any]:
        return {
            "pools": {"p": {"engine": "vllm", "backends": [{"url": url, "model": "tiny"}]}},
            "routes": [{"model": "long", "pools": ["p"]}],
        }

    def leave(gw: GatewayThread) -> None:
        stream_then_leave(gw, "long", 4000, lambda: True)

    vllm_frees_when_left(vllm_long_server, engine_launcher, data, leave, 4000)


def test_gateway_reads_engine_load(gateway: GatewayThread) -> None:
    """The scraper turns each engine's own /metrics into gateway_backend_load under our names."""
    wait_for(lambda: gateway.metric("gateway_backend_scrape_age_seconds") > 0, timeout=5)
    names = {
        s.labels["signal"]
        for f in gateway.gateway.metrics.registry.collect()
        for s in f.samples
        if s.name == "gateway_backend_load"
    }
    assert {"running", "waiting"} <= names
    text = httpx.get(gateway.base_url + "/metrics").text
    assert "vllm:" not in text and "llamacpp:" not in text
