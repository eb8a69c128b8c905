"""No client body and no upstream byte stream makes a translator raise anything but InvalidRequest:
seeded random mutations of the recorded requests and streams (a client's mistake is a 400, never a 500)."""

from __future__ import annotations

import contextlib
import copy
import json
import random
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.protocols.messages_reply import chat_to_message
from gateway.protocols.messages_stream import MessagesStream
from gateway.protocols.messages_translate import messages_to_chat
from gateway.protocols.responses_stream import ResponsesStream
from gateway.protocols.responses_translate import chat_to_response, responses_to_chat
from tests.unit.protocol_fixtures import ENGINES, request_body, stream_bytes

pytestmark = pytest.mark.unit

ODD: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    "",
    "x",
    [],
    [None],
    {},
    {"type": "text"},
    {"type": None},
    [{"type": "image"}],
]


def mutate(value: Any, rng: random.Random) -> Any:
    """The value with one node somewhere replaced by an odd one."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: mutate(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return [*value[:i], mutate(value[i], rng), *value[i + 1 :]]
    return copy.deepcopy(rng.choice(ODD))


def mutate_inside(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A body is always a JSON object (the pipeline's parser says so); mutate one of its members."""
    key = rng.choice(list(body))
    return {**body, key: mutate(body[key], rng)}


MESSAGES = ["messages", "messages_blocks", "messages_tools", "messages_tool_result", "messages_stream"]
RESPONSES = ["responses", "responses_items", "responses_tools", "responses_function_call_output"]


@pytest.mark.parametrize("seed", range(300))
def test_mutated_requests_translate_or_are_invalid_requests(seed: int) -> None:
    rng = random.Random(seed)
    for names, translate in ((MESSAGES, messages_to_chat), (RESPONSES, responses_to_chat)):
        body = mutate_inside(request_body("vllm", rng.choice(names)), rng)
        with contextlib.suppress(InvalidRequest):
            json.dumps(translate(body))


@pytest.mark.parametrize("seed", range(100))
def test_mutated_upstream_answers_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    name = rng.choice(["chat_for_messages_stream", "chat_for_messages_tools_stream", "chat_for_responses_stream"])
    data = stream_bytes(rng.choice(ENGINES), name)
    events = [e for e in data.split(b"\n\n") if e.startswith(b"data: {")]
    i = rng.randrange(len(events))
    mutated = mutate_inside(json.loads(events[i][6:]), rng)
    events[i] = b"data: " + json.dumps(mutated).encode()
    stream = b"\n\n".join(events) + b"\n\ndata: [DONE]\n\n"
    for translator in (MessagesStream(), ResponsesStream({"model": "m"}, created_at=1)):
        translator.feed(stream)
        translator.finish()
    whole = {
        "id": "c",
        "model": "m",
        "choices": [
            {
                "message": {"content": "a", "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "{}"}}]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1},
    }
    body = mutate_inside(whole, rng)
    chat_to_message(body)
    chat_to_response(body, {"model": "m"}, created_at=1)
