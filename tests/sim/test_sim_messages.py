"""The simulator's native Anthropic Messages against recordings of the real engines (vLLM 0.32 and
llama.cpp in tests/fixtures/*/protocols/, SGLang 0.5.23 in tests/fixtures/sglang/proto_*): status,
content type, every JSON key both ways, the protocol values, and the stream's event names in order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.sim.sim_helpers import SimFactory
from tests.sim.test_sim_fixtures import FIXTURES, compare_with_recording

pytestmark = pytest.mark.live

CONTEXT = {"vllm": 1024, "llamacpp": 512, "sglang": 1024}
NAMES = (
    "messages",
    "messages_stream",
    "messages_count_tokens",
    "messages_count_tokens_long",
    "error_messages_too_long",
    "error_messages_too_long_stream",
    "error_messages_missing_max_tokens",
)
SGLANG = {
    "messages": "proto_messages",
    "messages_stream": "proto_messages_stream",
    "messages_count_tokens": "proto_messages_count_tokens",
    "messages_count_tokens_long": "proto_messages_count_tokens_too_long",
    "error_messages_too_long": "proto_messages_too_long",
    "error_messages_too_long_stream": "proto_messages_too_long_stream",
    "error_messages_missing_max_tokens": "proto_messages_missing_max_tokens",
}


def recording(flavour: str, name: str) -> Path:
    if flavour == "sglang":
        return FIXTURES / "sglang" / f"{SGLANG[name]}.json"
    return FIXTURES / flavour / "protocols" / f"{name}.json"


def event_names(raw: bytes) -> list[str]:
    return re.findall(r"^event: (\S+)$", raw.decode(), flags=re.M)


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp", "sglang"])
async def test_sim_messages_match_the_recorded_engine(make_sim: SimFactory, flavour: str) -> None:
    sim = await make_sim(flavour, context_limit=CONTEXT[flavour])
    problems: list[str] = []
    for name in NAMES:
        path = recording(flavour, name)
        assert path.exists(), path
        problems += await compare_with_recording(sim, path)
    assert problems == []


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp", "sglang"])
async def test_sim_messages_stream_sends_the_recorded_event_sequence(make_sim: SimFactory, flavour: str) -> None:
    sim = await make_sim(flavour, context_limit=CONTEXT[flavour])
    rec = json.loads(recording(flavour, "messages_stream").read_text())
    real = event_names((recording(flavour, "messages_stream").parent / rec["body_file"]).read_bytes())
    async with httpx.AsyncClient(base_url=sim.base_url) as client:
        r = await client.post(rec["request"]["path"], json=rec["request"]["body"])
    mine = event_names(r.content)

    def squeeze(names: list[str]) -> list[str]:  # runs of deltas differ in length with the text
        return [n for i, n in enumerate(names) if n != "content_block_delta" or names[i - 1] != n]

    assert squeeze(mine) == squeeze(real) and mine.count("content_block_delta") > 0


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
async def test_sim_count_equals_tokenize_of_the_translated_chat(make_sim: SimFactory, flavour: str) -> None:
    """As on the real engines (docs/protocols.md): the native count is /tokenize of the chat the
    gateway's translation sends, so translated and native routes count alike."""
    sim = await make_sim(flavour)
    body = {"model": "tiny", "system": "be brief", "messages": [{"role": "user", "content": "hello there"}]}
    chat = {"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, body["messages"][0]]}
    async with httpx.AsyncClient(base_url=sim.base_url) as client:
        counted = (await client.post("/v1/messages/count_tokens", json=body)).json()["input_tokens"]
        tokenized = (await client.post("/tokenize", json=chat)).json()["count"]
    assert counted == tokenized > 0
