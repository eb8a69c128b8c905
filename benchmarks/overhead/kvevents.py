"""The kv_events balancer in the in-process harness (inprocess.py --balancer kv_events): the pool's
config, the requests' bodies, and the event batch an engine would publish for each request.

An engine publishes, for a request it served, the full blocks of its prompt and of the tokens it
generated (BlockStored, with their token ids), and, when its cache is full, as many blocks evicted
(BlockRemoved). Each request here gets one such batch: its blocks stored, and those of the request
`keep` places before it removed, so that the index holds `keep` requests' blocks, as an engine
whose cache is full does."""

from __future__ import annotations

import json
from typing import Any

import msgspec

BLOCK_SIZE = 128
"""vLLM's CPU block size (docs/routing-benchmark.md): the blocks the affinity benchmark's engines publish."""
GENERATED = 128
"""Tokens each request generates (its max_tokens in the overhead benchmark's body)."""
FILLER = 42
"""The id of the generated tokens in a batch (their value does not change the cost)."""
SYSTEM = (
    "You are a careful assistant for a small engineering team. Answer briefly, cite the file you "
    "read, and ask before you change anything that other people depend on. Prefer plain words to "
    "jargon, numbers to adjectives, and say when you do not know. Keep answers under ten lines."
)


def pool_yaml(balancer: str, upstream_port: int, events_ports: list[int], tokenizer: str = "") -> str:
    """The harness's `json` pool: one backend an events port (each at `upstream_port`, where the
    harness answers from memory), routed by `balancer`; a kv_events pool's backends name event
    endpoints that nothing publishes on (the harness feeds their subscribers itself)."""
    backends = []
    for port in events_ports:
        source = f', kv_events: {{endpoint: "tcp://127.0.0.1:{port}"}}' if balancer == "kv_events" else ""
        backends.append(f'{{url: "http://127.0.0.1:{upstream_port}"{source}}}')
    named = f', tokenizer: "{tokenizer}"' if tokenizer and balancer == "kv_events" else ""
    return f"json:  {{engine: vllm, balancer: {balancer}{named}, backends: [{', '.join(backends)}]}}"


def conversation(i: int, turns: int = 3) -> list[dict[str, str]]:
    """Conversation i: the shared system prompt, an opening of its own and `turns` turns (three:
    ~1,900 characters, as the affinity benchmark's fourth turn)."""
    words = " ".join(f"item{i}-{k}" for k in range(70))
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Conversation {i}. Here is the list to review: {words}."},
    ]
    for turn in range(turns):
        answer = f"Reviewed part {turn} of list {i}; three items need a closer look."
        messages.append({"role": "assistant", "content": answer})
        messages.append(
            {"role": "user", "content": f"Good. Now part {turn + 1}: which of them changed since last week?"}
        )
    return messages


def long_conversation(chars: int) -> list[dict[str, str]]:
    """One conversation of about `chars` characters in turns of ~1,000 (a coding agent's history:
    the shared system prompt, then user and assistant turns)."""
    messages = [{"role": "system", "content": SYSTEM}]
    size, turn = len(SYSTEM), 0
    while size < chars:
        words = " ".join(f"line{turn}-{k}" for k in range(100))
        role = "user" if turn % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"Turn {turn}: {words}."})
        size += len(messages[-1]["content"])
        turn += 1
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Go on."})
    return messages


def body(model: str, messages: list[dict[str, str]], max_tokens: int) -> bytes:
    return json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.7}).encode()


def events(ids: list[int], generated: int, stored_from: int, removed: list[int]) -> list[dict[str, Any]]:
    """A request's events, as vLLM publishes them: the blocks `removed` evicted, and the full blocks of
    `ids` followed by `generated` tokens stored under hashes from `stored_from`."""
    tokens = ids + [FILLER] * generated
    blocks = len(tokens) // BLOCK_SIZE
    out: list[dict[str, Any]] = []
    if removed:
        out.append({"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"})
    if blocks:
        out.append(
            {
                "type": "BlockStored",
                "block_hashes": list(range(stored_from, stored_from + blocks)),
                "parent_block_hash": None,
                "token_ids": tokens[: blocks * BLOCK_SIZE],
                "block_size": BLOCK_SIZE,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            }
        )
    return out


def frames(seq: int, batch_events: list[dict[str, Any]]) -> list[bytes]:
    """The frames (topic, seq, payload) of a vLLM batch holding `batch_events`."""
    payload: bytes = msgspec.msgpack.encode([float(seq), batch_events, 0])
    return [b"kv", seq.to_bytes(8, "big", signed=True), payload]


def batch(seq: int, ids: list[int], generated: int, stored_from: int, removed: list[int]) -> list[bytes]:
    """The frames of a batch holding one request's events (`events`)."""
    return frames(seq, events(ids, generated, stored_from, removed))


def batches(prompts: list[list[int]], generated: int, keep: int) -> list[list[bytes]]:
    """One batch a request (prompts: each request's prompt ids), the blocks of the request `keep`
    before it removed."""
    out: list[list[bytes]] = []
    hashes: list[list[int]] = []
    next_hash = 1
    for seq, ids in enumerate(prompts):
        blocks = (len(ids) + generated) // BLOCK_SIZE
        hashes.append(list(range(next_hash, next_hash + blocks)))
        removed = hashes[seq - keep] if seq >= keep else []
        out.append(batch(seq, ids, generated, next_hash, removed))
        next_hash += blocks
    return out
