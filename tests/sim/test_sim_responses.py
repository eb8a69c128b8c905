"""The simulator's Responses API and /detokenize against recordings of the real vLLM 0.32 and SGLang
0.5.23 (tests/fixtures/vllm/protocols/, tests/fixtures/sglang/proto_*): the same status, content type,
keys (both ways) and protocol values, by test_sim_fixtures.py's comparison; and what the shapes alone
cannot show: previous_response_id continues the stored conversation, GET returns the stored object."""

from __future__ import annotations

import httpx
import pytest

from tests.sim.sim_helpers import SimFactory
from tests.sim.test_sim_fixtures import FIXTURES, compare_with_recording

pytestmark = pytest.mark.live

RECORDED = {
    "vllm": [
        "protocols/responses",
        "protocols/responses_stream",
        "protocols/stored_responses",
        "protocols/stored_error_get_unknown",
        "protocols/stored_error_previous_unknown",
        "protocols/tokenize_prompt",
        "protocols/detokenize",
    ],
    "sglang": ["proto_responses", "proto_responses_stream", "proto_v1_tokenize_prompt", "tokenize_prompt"],
}


@pytest.mark.parametrize(("flavour", "name"), [(f, n) for f, names in RECORDED.items() for n in names])
async def test_sim_responses_match_the_recording(make_sim: SimFactory, flavour: str, name: str) -> None:
    sim = await make_sim(flavour=flavour, context_limit=1024 if flavour == "vllm" else 4096)
    if name.endswith("detokenize"):  # the sim's ids are hashes: it can only spell what it tokenized
        async with httpx.AsyncClient(base_url=sim.base_url) as client:
            await client.post("/tokenize", json={"model": "tiny", "prompt": "The gateway routes"})
    assert await compare_with_recording(sim, FIXTURES / flavour / f"{name}.json") == []


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
async def test_previous_response_id_continues_the_conversation(make_sim: SimFactory, flavour: str) -> None:
    sim = await make_sim(flavour=flavour)
    async with httpx.AsyncClient(base_url=sim.base_url) as client:
        first = (
            await client.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 3})
        ).json()
        follow = await client.post(
            "/v1/responses",
            json={"model": "tiny", "input": "and?", "max_output_tokens": 3, "previous_response_id": first["id"]},
        )
        got = await client.get(f"/v1/responses/{first['id']}")
        cancel = await client.post(f"/v1/responses/{first['id']}/cancel")
    assert follow.status_code == 200
    assert follow.json()["usage"]["input_tokens"] > first["usage"]["input_tokens"]  # the history counts
    assert got.json() == first
    assert cancel.status_code == 400 and "synchronous" in cancel.text
