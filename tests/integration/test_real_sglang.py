"""The gateway in front of a REAL SGLang server (CPU, tiny generated model), driven by the official
openai client: chat, streamed with include_usage; SGLang's own flat errors normalised (an over-long
prompt, and prompt + max_tokens over the context, which SGLang rejects where vLLM clamps); caps
enforced before the engine; SGLang's load read from its /metrics; a client that leaves mid-stream
frees the engine.

Part of every run (``tests/run.sh`` installs SGLang); ``GATEWAY_SGLANG=0`` skips them for a quick local
run, loudly, and fails them under CI=true (docs/testing.md, "The SGLang tier")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.gateway_harness import GatewayThread, engine_metric, leave_mid_stream, running_gateway, wait_for

IGNORE_EOS = {"ignore_eos": True}  # random weights: never stop early, so "length" is deterministic
TOO_LONG = "word " * 3000  # about 9000 tokens with the tiny tokenizer: over the 4096 context


def sglang_metric(server: Any, name: str) -> float:
    """A metric from SGLang's own /metrics, under either prefix ("sglang:" or "sglang_")."""
    return engine_metric(server.metrics_url, f"sglang:{name}") + engine_metric(server.metrics_url, f"sglang_{name}")


@pytest.fixture(scope="module")
def gateway(sglang_server: Any) -> Iterator[GatewayThread]:
    data = {
        "health": {"interval_s": 2, "scrape_interval_s": 1},
        "pools": {
            "sglang": {"engine": "sglang", "backends": [{"url": sglang_server.base_url, "model": "tiny"}]},
            # The same engine, its window not discovered: the raw route's prompts reach SGLang.
            "sglang-raw": {"engine": "sglang",
                           "backends": [{"url": sglang_server.base_url, "model": "tiny", "discover_models": False}]},
        },
        "routes": [
            {"model": "sglang", "pools": ["sglang"],
             "caps": {"max_context_tokens": sglang_server.max_context, "default_max_tokens": 16}},
            {"model": "sglang-raw", "pools": ["sglang-raw"]},  # no cap: SGLang's own errors come through
        ],
    }  # fmt: skip
    with running_gateway(data) as gw:
        yield gw


@pytest.fixture
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="client-key", max_retries=0, timeout=120)
    yield c
    c.close()


def test_chat_non_stream(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="sglang", messages=[{"role": "user", "content": "hello there"}], max_tokens=6, extra_body=IGNORE_EOS
    )
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 0


def test_chat_stream_with_usage(client: openai.OpenAI, gateway: GatewayThread) -> None:
    before = gateway.metric("gateway_output_tokens_total", route="sglang", source="usage")
    chunks = list(
        client.chat.completions.create(
            model="sglang",
            messages=[{"role": "user", "content": "tell me"}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IGNORE_EOS,
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    wait_for(lambda: gateway.metric("gateway_output_tokens_total", route="sglang", source="usage") == before + 8, 2)


def test_chat_stream_without_usage_is_still_counted(client: openai.OpenAI, gateway: GatewayThread) -> None:
    before = gateway.metric("gateway_output_tokens_total", route="sglang", source="usage")
    chunks = list(
        client.chat.completions.create(
            model="sglang", messages=[{"role": "user", "content": "go"}], max_tokens=5, stream=True,
            extra_body=IGNORE_EOS,
        )
    )  # fmt: skip
    assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for is stripped
    wait_for(lambda: gateway.metric("gateway_output_tokens_total", route="sglang", source="usage") == before + 5, 2)


@pytest.mark.parametrize("model", ["sglang", "sglang-raw"])
@pytest.mark.parametrize("stream", [False, True])
def test_over_long_prompt_is_context_length_exceeded(client: openai.OpenAI, model: str, stream: bool) -> None:
    """The capped route stops it in the gateway; the raw route passes it to SGLang, whose flat error
    (``{"object":"error","message":"The input (N tokens) is longer than the model's context length
    ...","code":400}``) is normalised to the OpenAI shape with code context_length_exceeded."""
    with pytest.raises(openai.BadRequestError) as info:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": TOO_LONG}], max_tokens=4, stream=stream
        )
        if stream:
            list(r)
    assert info.value.status_code == 400
    assert info.value.code == "context_length_exceeded"
    assert info.value.type == "invalid_request_error"


def test_prompt_plus_max_tokens_over_context_is_normalised(client: openai.OpenAI, sglang_server: Any) -> None:
    """SGLang (unlike vLLM and llama.cpp) rejects a prompt that fits when prompt + max_tokens does not:
    400 "Requested token count exceeds the model's maximum context length ...". Through a route
    without a cap that 400 reaches the client as context_length_exceeded."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="sglang-raw", messages=[{"role": "user", "content": "hi"}], max_tokens=sglang_server.max_context - 4
        )
    assert info.value.code == "context_length_exceeded"
    assert "maximum context length" in info.value.message


def test_clamp_to_the_cap_fits_sglang(sglang_server: Any) -> None:
    """A capped route clamps max_tokens to what fits, so the client's over-large request succeeds. A
    fresh gateway, so that the estimate is the untrained prior: near the cap the gateway asks SGLang's
    /tokenize for the exact chat count (SGLang, unlike vLLM and llama.cpp, rejects an over-long total
    instead of clamping it itself). The prompt fills most of the window (about 3900 of 4096 tokens),
    so that the clamped generation is short: with a short prompt it would be ~4000 tokens, 9 s on an
    idle machine and past the client's timeout on a loaded one."""
    cap = sglang_server.max_context
    long_prompt = "word " * 1300  # 3916 tokens with the chat template
    data = {
        "pools": {"p": {"engine": "sglang", "backends": [{"url": sglang_server.base_url, "model": "tiny"}]}},
        "routes": [{"model": "capped", "pools": ["p"], "caps": {"max_context_tokens": cap}}],
    }
    with running_gateway(data) as gw:
        c = openai.OpenAI(base_url=gw.base_url + "/v1", api_key="k", max_retries=0, timeout=120)
        try:
            raw = c.chat.completions.with_raw_response.create(
                model="capped",
                messages=[{"role": "user", "content": long_prompt}],
                max_tokens=cap - 4,
                extra_body=IGNORE_EOS,
            )
        finally:
            c.close()
    clamped = int(raw.headers["x-gateway-max-tokens-clamped"])
    reply = raw.parse()
    assert reply.usage is not None
    # SGLang accepted it (no 400) and ran to the limit: its own, 2 tokens short of a full window here
    assert reply.choices[0].finish_reason == "length" and 0 < reply.usage.completion_tokens <= clamped
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= cap


def test_over_cap_never_reaches_the_engine(client: openai.OpenAI, gateway: GatewayThread, sglang_server: Any) -> None:
    before = sglang_metric(sglang_server, "prompt_tokens_total")
    requests_before = sglang_metric(sglang_server, "num_requests_total")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="sglang", messages=[{"role": "user", "content": TOO_LONG}])
    assert info.value.code == "context_length_exceeded"
    assert sglang_metric(sglang_server, "prompt_tokens_total") == before
    assert sglang_metric(sglang_server, "num_requests_total") == requests_before
    assert gateway.metric("gateway_context_cap_total", route="sglang", action="rejected") >= 1


def test_gateway_reads_sglang_load(gateway: GatewayThread) -> None:
    """The scraper turns SGLang's own /metrics into gateway_backend_load under our names."""
    wait_for(lambda: gateway.metric("gateway_backend_scrape_age_seconds") > 0, timeout=5)

    def signals() -> set[str]:
        return {
            s.labels["signal"]
            for f in gateway.gateway.metrics.registry.collect()
            for s in f.samples
            if s.name == "gateway_backend_load"
        }

    wait_for(lambda: {"running", "waiting"} <= signals(), timeout=5)
    text = httpx.get(gateway.base_url + "/metrics").text
    assert "sglang:" not in text and "sglang_" not in text


def _stream_then_leave(gateway: GatewayThread, model: str, max_tokens: int, engine_busy: Callable[[], bool]) -> None:
    """Start a long stream through the gateway, wait until the engine reports it running, then vanish."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "go on"}]}  # fmt: skip
    leave_mid_stream(gateway, "/v1/chat/completions", body, b"data: ", engine_busy)


def test_disconnect_frees_the_sglang_request(gateway: GatewayThread, sglang_server: Any) -> None:
    """The gateway's client leaves mid-stream; the gateway drops the upstream stream, and SGLang aborts
    the request: its running gauge is back to 0 within seconds, its abort counter moves, and the
    request's generated tokens (counted when it ends, aborted ones included) are far short of
    max_tokens."""

    def running() -> float:
        return sglang_metric(sglang_server, "num_running_reqs")

    def generated() -> float:
        return sglang_metric(sglang_server, "generation_tokens_total")

    def aborted() -> float:  # absent until the first abort
        return sglang_metric(sglang_server, "num_aborted_requests_total")

    wait_for(lambda: running() == 0, timeout=5, interval=0.1)
    before, aborted_before = generated(), aborted()
    max_tokens = sglang_server.max_context - 32
    _stream_then_leave(gateway, "sglang-raw", max_tokens, lambda: running() >= 1)
    wait_for(lambda: running() == 0, timeout=5.0, interval=0.1)
    wait_for(lambda: aborted() > aborted_before, timeout=5.0, interval=0.1)
    wait_for(lambda: gateway.metric("gateway_client_disconnects_total", route="sglang-raw", stage="mid_stream") >= 1, 2)
    wait_for(lambda: generated() > before, timeout=5, interval=0.1)
    settled = generated()
    assert settled - before < max_tokens / 2  # cut well short of its max_tokens
    assert aborted() == aborted_before + 1
