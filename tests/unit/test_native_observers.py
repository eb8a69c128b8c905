"""The native Messages and Responses stream observers, on real engines' recorded streams and on the
translators' output: usage, content events, the end, at any byte split, with the bytes unchanged."""

from __future__ import annotations

import pytest

from gateway.protocols.messages_stream import MessagesStream
from gateway.protocols.native_observers import NativeObserver
from gateway.protocols.responses_stream import ResponsesStream
from tests.unit.protocol_fixtures import ENGINES, events, request_body, stream_bytes

pytestmark = pytest.mark.unit


def observe(observer: NativeObserver, data: bytes, size: int) -> bytes:
    out = b""
    for i in range(0, len(data), size):
        out += observer.feed(data[i : i + size], now=float(i))
    return out + observer.flush()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("size", [1, 13, 100_000])
def test_a_native_messages_stream(engine: str, size: int) -> None:
    data = stream_bytes(engine, "messages_stream")
    observer = NativeObserver.messages()
    assert observe(observer, data, size) == data
    parsed = events(data)
    start = parsed[0][1]["message"]["usage"]
    final = next(d for k, d in parsed if k == "message_delta")["usage"]
    prompt = sum(start.get(k, 0) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    assert observer.usage == {
        "prompt_tokens": prompt,
        "completion_tokens": final["output_tokens"],
        "total_tokens": prompt + final["output_tokens"],
    }
    assert observer.content_events == sum(1 for k, _ in parsed if k == "content_block_delta") == 5
    assert observer.done and observer.error is None
    assert observer.first_token_at is not None and len(observer.gaps) == observer.content_events - 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_native_messages_tool_stream_counts_argument_deltas_as_tokens(engine: str) -> None:
    data = stream_bytes(engine, "messages_tools_stream")
    observer = NativeObserver.messages()
    observe(observer, data, 7)
    assert observer.content_events == sum(1 for k, _ in events(data) if k == "content_block_delta") > 0
    final = next(d for k, d in events(data) if k == "message_delta")["usage"]
    assert observer.usage is not None and observer.usage["completion_tokens"] == final["output_tokens"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_native_responses_stream(engine: str) -> None:
    data = stream_bytes(engine, "responses_stream")
    observer = NativeObserver.responses()
    assert observe(observer, data, 11) == data
    usage = events(data)[-1][1]["response"]["usage"]
    assert observer.usage == {
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "total_tokens": usage["input_tokens"] + usage["output_tokens"],
    }
    deltas = sum(1 for k, _ in events(data) if k == "response.output_text.delta")
    assert observer.content_events == deltas > 0 and observer.done


@pytest.mark.parametrize("engine", ENGINES)
def test_translated_streams_account_the_same_as_the_chat_stream_they_came_from(engine: str) -> None:
    for name, translator, observer in (
        ("messages_stream", MessagesStream(), NativeObserver.messages()),
        (
            "responses_stream",
            ResponsesStream(request_body(engine, "responses_stream"), created_at=1),
            NativeObserver.responses(),
        ),
    ):
        chat = stream_bytes(engine, f"chat_for_{name}")
        observe(observer, translator.feed(chat) + translator.finish(), 5)
        usage = events(chat)[-1][1]["usage"]
        assert observer.usage is not None
        assert (observer.usage["prompt_tokens"], observer.usage["completion_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        deltas = sum(1 for _, d in events(chat) for c in d["choices"] if c["delta"].get("content"))
        assert observer.content_events == deltas and observer.done


def test_error_events() -> None:
    observer = NativeObserver.messages()
    observer.feed(b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n', 0.0)
    # Anthropic's type gets its status as `code`, which the relay reads to make an HTTP error of it.
    assert observer.error == {"type": "error", "error": {"type": "overloaded_error", "message": "busy", "code": 529}}
    failed = NativeObserver.responses()
    failed.feed(
        b"event: response.failed\n"
        b'data: {"type":"response.failed","response":{"status":"failed",'
        b'"error":{"code":"server_error","message":"x"}}}\n\n',
        0.0,
    )
    assert failed.done and failed.error == {"error": {"code": "server_error", "message": "x"}}


def test_a_messages_stream_holds_only_its_preamble() -> None:
    observer = NativeObserver.messages()
    assert not observer.holding  # nothing seen yet: the relay's first read decides
    observer.feed(b'event: message_start\ndata: {"type":"message_start","message":{"usage":{}}}\n\n', 0.0)
    assert observer.holding
    observer.feed(b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n', 0.1)
    assert not observer.holding
    responses = NativeObserver.responses()
    responses.feed(b'event: response.created\ndata: {"type":"response.created"}\n\n', 0.0)
    assert not responses.holding  # Responses streams are relayed as they come
