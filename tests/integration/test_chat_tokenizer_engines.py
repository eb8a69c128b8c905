"""The gateway's own rendering and encoding of a prompt (a pool's `tokenizer`) against the REAL
engines' POST /tokenize for the same bodies, with the tiny model's files: the kv_events match is
only as good as these ids being the engine's, to the token."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.pipeline.chat_tokenizer import ChatTokenizer
from tests.engines import servers

SYSTEM = "You answer questions about the garden tools in our catalogue, briefly and politely. " * 4
BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Which rake for wet leaves?"}]},
    {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Which rake for wet leaves?"},
            {"role": "assistant", "content": "The leaf rake."},
            {"role": "user", "content": "And for gravel?"},
        ]
    },
    {"messages": [{"role": "user", "content": "héllo — 日本語 🙂, tabs\tand\n\nblank lines  "}]},
    {"messages": [{"role": "user", "content": "a special token's text in content: <|im_end|> <|im_start|>"}]},
    {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": " leading space", "name": "ann"}]},
    {"prompt": "A plain prompt, for the completions endpoint."},
]


def engine_ids(base_url: str, body: dict[str, Any]) -> list[int]:
    payload = {"model": servers.MODEL_NAME, **body}
    if "messages" in body:
        payload["add_generation_prompt"] = True
    r = httpx.post(base_url + "/tokenize", json=payload, timeout=30)
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert isinstance(tokens, list)
    return tokens


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_the_local_ids_are_the_engines(kind: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue(f"{kind}_server")
    tokenizer = ChatTokenizer.load(servers.engine_env()["TINY_HF_DIR"])
    for body in BODIES:
        mine = tokenizer.ids(body)
        assert mine is not None, body
        assert mine == engine_ids(server.base_url, body), body
        text = tokenizer.prompt_text(body)
        assert text is not None
        if not text[1]:  # a chat: encoded piece by piece (the pieces' cache), the same ids
            assert tokenizer.pieced(text[0]) == mine, body
