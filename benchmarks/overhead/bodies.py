"""Static OpenAI-shaped bodies for the fast upstream (nginx) and for the paced upstream: one
chat.completion object, and an SSE stream of N chat.completion.chunk events ending in a usage
chunk and `data: [DONE]`, byte for byte what vLLM sends with stream_options.include_usage."""

from __future__ import annotations

import json

MODEL = "bench-model"
CREATED = 1_700_000_000
_SEP = (",", ":")


def completion() -> bytes:
    body = {
        "id": "chatcmpl-bench0000000000000000000000",
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hello! This is a static benchmark answer of a few "
                    "dozen tokens, roughly the size of a short real reply from an engine.",
                    "tool_calls": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "usage": {"prompt_tokens": 12, "total_tokens": 40, "completion_tokens": 28},
        "prompt_logprobs": None,
    }
    return json.dumps(body, separators=_SEP).encode()


def chunk_event(i: int, text: str | None = None, finish: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, object] = {}
    if role:
        delta["role"] = "assistant"
    delta["content"] = f" tok{i}" if text is None else text
    event = {
        "id": "chatcmpl-bench0000000000000000000000",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event, separators=_SEP).encode() + b"\n\n"


def usage_event(completion_tokens: int) -> bytes:
    event = {
        "id": "chatcmpl-bench0000000000000000000000",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 12, "total_tokens": 12 + completion_tokens, "completion_tokens": completion_tokens},
    }
    return b"data: " + json.dumps(event, separators=_SEP).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def stream_events(n: int) -> list[bytes]:
    """N content chunks (the last with finish_reason), the usage chunk, then [DONE]."""
    events = [chunk_event(i, role=(i == 0), finish="stop" if i == n - 1 else None) for i in range(n)]
    return [*events, usage_event(n), DONE]


def stream(n: int) -> bytes:
    return b"".join(stream_events(n))
