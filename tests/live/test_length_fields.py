"""max_tokens_limit holds for every engine's own output-length field (docs/reliability.md defect 6):
`n_predict` (llama.cpp), `max_completion_tokens`, `max_new_tokens`, `num_predict`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.live.conftest import StackFactory, chat, sim_params

pytestmark = pytest.mark.live

LIMITED: list[dict[str, Any]] = [{"model": "tiny", "pools": ["llama"], "caps": {"max_tokens_limit": 8}}]


@pytest.mark.parametrize(
    "fields",
    [
        {"n_predict": 50},
        {"n_predict": 50, "max_tokens": 4},
        {"n_predict": -1},
        {"max_new_tokens": 50, "n_predict": 40},
        {"max_completion_tokens": 4, "max_tokens": 50, "num_predict": 30},
    ],
)
async def test_every_length_field_is_clamped(make_stack: StackFactory, fields: dict[str, int]) -> None:
    stack = await make_stack(pools={"llama": [sim_params("llamacpp")]}, routes=LIMITED)
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.post(stack.base_url + "/v1/chat/completions", json={**chat(), **fields})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 8
    sent = stack.sims["llama-0"].stats.recent[-1].body
    for name in fields:
        assert sent[name] == 8, (name, sent)
    header = "x-gateway-max-tokens" if fields == {"n_predict": -1} else "x-gateway-max-tokens-clamped"
    assert r.headers[header] == "8"


async def test_an_invalid_engine_length_field_is_a_400(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"llama": [sim_params("llamacpp")]}, routes=LIMITED)
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.post(stack.base_url + "/v1/chat/completions", json=chat(n_predict=-7))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict"
    assert stack.sims["llama-0"].stats.seen == 0
