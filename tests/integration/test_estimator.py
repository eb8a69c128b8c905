"""After 20 requests, the gateway's token estimate for chat prompts is within 5 % of the
engine's exact count, on a real vLLM."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.policy.caps import prompt_size
from tests.integration.gateway_harness import GatewayThread, running_gateway

SENTENCE = (
    "the model routes each request to a backend that holds its prefix in the cache while the gateway counts "
    "tokens learns ratios and keeps memory bounded under load with many users asking about weather code poems "
    "numbers 42 3.14 and names like Ada Lovelace"
)
WORDS = SENTENCE.split(" ")


def prompt(rng: random.Random) -> list[dict[str, str]]:
    turns = rng.randint(1, 3)
    messages = [{"role": "system", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 30)))}]
    for _ in range(turns):
        messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))})
        messages.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 25)))})
    messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(3, 30)))})
    return messages


@pytest.fixture(scope="module")
def gateway(vllm_server: Any) -> Iterator[GatewayThread]:
    # The cap is far above these prompts, so every request is estimated, never counted exactly:
    # the estimator learns only from the usage that responses report.
    data = {
        "pools": {"vllm": {"engine": "vllm", "backends": [{"url": vllm_server.base_url, "model": "tiny"}]}},
        "routes": [{"model": "tiny", "pools": ["vllm"], "caps": {"max_context_tokens": 4096}}],
    }
    with running_gateway(data) as gw:
        yield gw


def test_estimate_within_five_percent_after_twenty_requests(gateway: GatewayThread, vllm_server: Any) -> None:
    rng = random.Random(5)
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    for _ in range(20):
        client.chat.completions.create(model="tiny", messages=prompt(rng), max_tokens=1)  # type: ignore[arg-type]
    client.close()
    estimator = gateway.gateway.caps.estimator
    errors = []
    for _ in range(20):
        messages = prompt(rng)
        chars, count, known, _ = prompt_size({"messages": messages})
        estimate = estimator.estimate(("tiny", "tiny"), chars, count, known)
        exact = httpx.post(
            vllm_server.base_url + "/tokenize",
            timeout=10,
            json={"model": "tiny", "messages": messages, "add_generation_prompt": True},
        ).json()["count"]
        errors.append(abs(estimate - exact) / exact)
    mean = sum(errors) / len(errors)
    print(f"estimator mean abs error after 20 requests: {mean:.2%} (max {max(errors):.2%})")
    assert mean <= 0.05, errors
