"""The SHIPPED gateway.yaml in front of REAL engines: agent traffic that repeats a long system prompt
is routed to the SGLang pool by the ``shared-prefix`` rule, and SGLang's radix cache serves the repeated
prefix (its ``cached_tokens_total`` counter and the reply's ``usage.prompt_tokens_details``).

The config is gateway.yaml as shipped, with two changes a deployment makes too: each pool's backend URL
points at a real server here (llama.cpp, vLLM, SGLang on free ports), and ``routing.platform`` is
``nvidia_gpu`` (the documented override; on this GPU-less host ``auto`` would detect ``no_nvidia_gpu``,
and the shipped ``no-gpu`` rule sends everything to llama.cpp)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.integration.gateway_harness import GatewayThread, engine_metric, running_gateway

SHIPPED = Path(__file__).resolve().parents[2] / "gateway.yaml"


def shipped_config(urls: dict[str, str]) -> dict[str, Any]:
    """gateway.yaml as shipped, with each pool's backends replaced by one real server."""
    data: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    assert set(data["pools"]) == set(urls), "gateway.yaml's pools changed: update this test"
    for name, pool in data["pools"].items():
        pool["backends"] = [{"url": urls[name]}]
    data["routing"]["platform"] = "nvidia_gpu"
    return data


def cached_tokens_total(server: Any) -> float:
    """SGLang's prefix-cache counter (summed over ``cache_source``), under either prefix."""
    return engine_metric(server.metrics_url, "sglang:cached_tokens_total") + engine_metric(
        server.metrics_url, "sglang_cached_tokens_total"
    )


@pytest.fixture(scope="module")
def gateway(llamacpp_server: Any, vllm_server: Any, sglang_server: Any) -> Iterator[GatewayThread]:
    urls = {"llamacpp": llamacpp_server.base_url, "vllm": vllm_server.base_url, "sglang": sglang_server.base_url}
    with running_gateway(shipped_config(urls)) as gw:
        yield gw


def test_shared_prefix_traffic_reaches_sglang_and_reuses_its_cache(gateway: GatewayThread, sglang_server: Any) -> None:
    # A system prompt of its own (about 1.1 KB: over the 1024-character shared-prefix minimum, under
    # vLLM's 1024-token context), so that no earlier request warmed either the tracker or the cache.
    system = f"agent {uuid.uuid4().hex}: " + "answer briefly and politely. " * 38
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="k", max_retries=0, timeout=120)

    def turn(question: str) -> Any:
        return client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=4,
        )

    try:
        first = turn("what is one plus one?")
        second = turn("and two plus two?")
        before = cached_tokens_total(sglang_server)
        third = turn("and three plus three?")
        after = cached_tokens_total(sglang_server)
    finally:
        client.close()

    # The first sight of a prefix is not shared-prefix traffic (min_seen 2): the default rule, vLLM.
    assert (first.headers["x-gateway-rule"], first.headers["x-gateway-pool"]) == ("default", "vllm")
    # The second and third carry it again: the shared-prefix rule sends them to SGLang.
    for raw in (second, third):
        assert (raw.headers["x-gateway-rule"], raw.headers["x-gateway-pool"]) == ("shared-prefix", "sglang")

    # SGLang computed the prefix for the second request and reused it for the third: all but the
    # differing question (and the template's tail) came from its cache.
    second_reply, third_reply = second.parse(), third.parse()
    assert third_reply.usage is not None and third_reply.usage.prompt_tokens_details is not None
    cached = third_reply.usage.prompt_tokens_details.cached_tokens
    prompt = third_reply.usage.prompt_tokens
    assert cached is not None and 0.8 * prompt <= cached < prompt
    assert after - before == cached  # the engine's own counter agrees with the reply
    assert second_reply.usage is not None and second_reply.usage.prompt_tokens_details is not None
    assert (second_reply.usage.prompt_tokens_details.cached_tokens or 0) < 0.2 * second_reply.usage.prompt_tokens
