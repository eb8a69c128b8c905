"""Anthropic Messages <-> chat translation, checked against what real vLLM 0.32 and llama.cpp answer
natively (tests/fixtures/*/protocols: each native request was also sent, translated, to the
engine's /v1/chat/completions as chat_for_NAME). The SDKs read the output in
tests/live/test_protocol_sdks.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.protocols.dropped import Dropped
from gateway.protocols.messages_reply import chat_to_message, stop_reason, usage_to_anthropic
from gateway.protocols.messages_stream import MessagesStream
from gateway.protocols.messages_translate import count_tokens_to_tokenize, messages_to_chat
from tests.unit.protocol_fixtures import (
    ENGINES,
    events,
    feed_in_pieces,
    key_paths,
    load,
    request_body,
    squeeze,
    stream_bytes,
)

pytestmark = pytest.mark.unit

TRANSLATED = ("messages", "messages_stream", "messages_tools", "messages_tools_stream", "messages_tool_result")
# Keys Anthropic documents that an engine's native answer leaves out (vLLM drops null stop_sequence).
ANTHROPIC_KEYS = {"stop_sequence"}


def translate_stream(engine: str, name: str, seed: int = 0, **kwargs: Any) -> bytes:
    translator = MessagesStream(**kwargs)
    out = feed_in_pieces(translator.feed, stream_bytes(engine, f"chat_for_{name}"), seed)
    return out + translator.finish()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", TRANSLATED)
def test_the_recorded_chat_requests_are_this_translation(engine: str, name: str) -> None:
    assert messages_to_chat(request_body(engine, name)) == request_body(engine, f"chat_for_{name}")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["messages", "messages_tools", "messages_tool_result"])
def test_a_translated_response_has_the_native_shape(engine: str, name: str) -> None:
    native = load(engine, name)["body"]
    translated = chat_to_message(load(engine, f"chat_for_{name}")["body"])
    assert key_paths(native) - key_paths(translated) == set()
    assert key_paths(translated) - key_paths(native) <= ANTHROPIC_KEYS | {"usage.cache_creation_input_tokens"}
    assert [b["type"] for b in translated["content"]] == [b["type"] for b in native["content"]]
    assert translated["stop_reason"] == native["stop_reason"]
    assert translated["id"].startswith("msg_")


def test_a_forced_tool_call_becomes_a_tool_use_block_with_parsed_input() -> None:
    chat = load("vllm", "chat_for_messages_tools")["body"]
    call = chat["choices"][0]["message"]["tool_calls"][0]
    message = chat_to_message(chat)
    assert message["content"] == [
        {
            "type": "tool_use",
            "id": call["id"],
            "name": "get_weather",
            "input": json.loads(call["function"]["arguments"]),
        }
    ]
    assert message["stop_reason"] == "tool_use"  # vLLM says finish_reason "stop" for a named tool call
    usage = chat["usage"]
    assert message["usage"]["input_tokens"] + message["usage"]["cache_read_input_tokens"] == usage["prompt_tokens"]
    assert message["usage"]["output_tokens"] == usage["completion_tokens"]


def keys_by_event(data: bytes) -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    for kind, event in events(data):
        keys.setdefault(str(kind), set()).update(key_paths(event))
    return keys


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["messages_stream", "messages_tools_stream"])
def test_a_translated_stream_has_the_native_event_sequence_and_keys(engine: str, name: str) -> None:
    """Same event types in the same order; every key the engine sends natively is there, and nothing
    that neither engine sends (llama.cpp's message_delta carries only output_tokens, vLLM's all four)."""
    translated_bytes = translate_stream(engine, name)
    translated = events(translated_bytes)
    assert squeeze(str(kind) for kind, _ in translated) == squeeze(
        str(kind) for kind, _ in events(stream_bytes(engine, name))
    )
    for kind, data in translated:
        assert kind == data["type"]  # the event: line names the data's type
    ours = keys_by_event(translated_bytes)
    native = keys_by_event(stream_bytes(engine, name))
    union = [keys_by_event(stream_bytes(e, name)) for e in ENGINES]
    for kind, keys in ours.items():
        assert keys - set().union(*(u.get(kind, set()) for u in union)) == set(), kind
        assert native[kind] - keys <= {"message.usage.cache_read_input_tokens"}, (
            kind
        )  # llama.cpp's, known only at the end


@pytest.mark.parametrize("seed", range(5))
def test_the_stream_is_the_same_however_the_bytes_are_split(seed: int) -> None:
    whole = MessagesStream()
    expected = whole.feed(stream_bytes("vllm", "chat_for_messages_tools_stream")) + whole.finish()
    assert [d for _, d in events(translate_stream("vllm", "messages_tools_stream", seed))][1:] == [
        d for _, d in events(expected)
    ][1:]


def test_streamed_tool_arguments_add_up_to_the_chat_arguments_and_usage_is_final() -> None:
    out = events(translate_stream("vllm", "messages_tools_stream"))
    partial = "".join(d["delta"]["partial_json"] for k, d in out if k == "content_block_delta")
    chat = events(stream_bytes("vllm", "chat_for_messages_tools_stream"))
    arguments = "".join(
        call["function"].get("arguments", "")
        for _, d in chat
        for c in d["choices"]
        for call in c["delta"].get("tool_calls", [])
    )
    assert partial == arguments
    start = next(d for k, d in out if k == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "get_weather"
    delta = next(d for k, d in out if k == "message_delta")
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    usage = chat[-1][1]["usage"]
    assert delta["usage"]["output_tokens"] == usage["completion_tokens"]


def test_system_blocks_content_blocks_and_sampling() -> None:
    chat = messages_to_chat(request_body("vllm", "messages_blocks"))
    assert chat["messages"] == [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Say something about the gateway."},
    ]
    assert (chat["temperature"], chat["top_p"], chat["top_k"], chat["stop"]) == (0.5, 0.9, 20, ["\n\n\n"])
    assert chat["user"] == "user-1" and "metadata" not in chat
    assert chat["max_tokens"] == 8 and "stream" not in chat


def test_images_tool_use_and_tool_results() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "stream": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.test/a.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Calling."},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                    {"type": "tool_use", "id": "t2", "name": "g", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "one"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "two", "is_error": True},
                    {"type": "text", "text": "Go on."},
                ],
            },
        ],
    }
    chat = messages_to_chat(body)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "https://example.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "reasoning": "hmm",
            "content": "Calling.",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                {"id": "t2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t2", "content": "two"},
        {"role": "user", "content": "Go on."},
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "tool", "name": "f"}, {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
        ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required", "parallel_tool_calls": False}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    tools = [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]
    chat = messages_to_chat(
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "x"}],
            "tools": tools,
            "tool_choice": choice,
        }
    )
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "description": "d"}}
    ]
    assert {k: chat[k] for k in expected} == expected


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "stop_sequences": "x"},
    ],
)
def test_a_body_with_no_conversation_is_an_invalid_request(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        messages_to_chat({"model": "m", "max_tokens": 1, **body})


@pytest.mark.parametrize(
    ("body", "dropped"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "document", "source": {}}]}
                ]
            },
            ["document"],
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x"}, {"type": "image", "source": {"type": "file"}}],
                    }
                ]
            },
            ["image"],
        ),
        ({"system": [{"type": "image"}]}, ["system.image"]),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, ["web_search_20250305"]),
        ({"tools": [{"name": "no_schema"}]}, ["tool_without_schema"]),
        ({"tool_choice": {"type": "tool"}}, []),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, ["thinking", "output_config"]),
        ({"context_management": {"edits": []}}, ["context_management"]),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x"}, {"type": "search_result", "content": []}],
                    }
                ]
            },
            ["search_result"],
        ),
        (
            {"tools": [{"name": "f", "input_schema": {"type": "object"}, "defer_loading": True}]},
            ["defer_loading"],
        ),
    ],
)
def test_what_chat_cannot_express_is_dropped_and_named(body: dict[str, Any], dropped: list[str]) -> None:
    lost = Dropped()
    full = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], **body}
    chat = messages_to_chat(full, lost)
    assert lost.names == dropped
    assert chat["messages"], "the conversation is still there"
    for tool in chat.get("tools", []):
        assert tool["function"]["parameters"], "never an empty-schema function"
    assert "web_search" not in json.dumps(chat.get("tools", []))


def test_a_mid_conversation_system_message_joins_the_user_turn_before_it() -> None:
    chat = messages_to_chat(
        {
            "model": "m",
            "max_tokens": 1,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=abc12;"},
                {"type": "text", "text": "You are an agent."},
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
                {"role": "system", "content": "between"},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
                {"role": "user", "content": "next"},
            ],
        }
    )
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert chat["messages"][0]["content"] == "You are an agent.", "the per-request billing line is left out"
    assert chat["messages"][1]["content"] == "hi\n\n# Environment"
    assert chat["messages"][3]["content"] == "ok", "nothing between a tool call and its result"
    assert chat["messages"][4]["content"] == "between\n\nnext"


@pytest.mark.parametrize(
    ("finish", "matched", "tool_used", "expected"),
    [
        ("stop", None, False, ("end_turn", None)),
        ("length", None, True, ("max_tokens", None)),
        ("tool_calls", None, True, ("tool_use", None)),
        ("stop", None, True, ("tool_use", None)),
        ("stop", "END", False, ("stop_sequence", "END")),
        ("stop", 2, False, ("end_turn", None)),
        ("content_filter", None, False, ("refusal", None)),
    ],
)
def test_stop_reason(finish: str, matched: Any, tool_used: bool, expected: tuple[str, str | None]) -> None:
    assert stop_reason(finish, matched, tool_used) == expected


def test_a_matched_stop_string_becomes_stop_sequence() -> None:
    chat = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"message": {"content": "a"}, "finish_reason": "stop", "stop_reason": "END"}],
    }
    message = chat_to_message(chat)
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    sglang = {"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "matched_stop": "END"}]}
    assert chat_to_message(sglang)["stop_sequence"] == "END"


def test_usage_splits_cached_tokens_out_as_anthropic_counts_them() -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}}
    assert usage_to_anthropic(usage) == {
        "input_tokens": 36,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 64,
    }
    assert usage_to_anthropic({"prompt_tokens": 5, "completion_tokens": 1}) == {"input_tokens": 5, "output_tokens": 1}


def test_unparsable_tool_arguments_become_an_empty_input() -> None:
    chat = {
        "choices": [
            {
                "message": {"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a": '}}]},
                "finish_reason": "length",
            }
        ]
    }
    message = chat_to_message(chat)
    assert message["content"][0]["input"] == {} and message["stop_reason"] == "max_tokens"


def test_reasoning_becomes_a_thinking_block_first() -> None:
    chat = {"choices": [{"message": {"reasoning": "because", "content": "yes"}, "finish_reason": "stop"}]}
    assert [b["type"] for b in chat_to_message(chat)["content"]] == ["thinking", "text"]
    stream = MessagesStream()
    data = b"".join(
        b"data: "
        + json.dumps({"id": "c", "model": "m", "choices": [{"delta": delta, "finish_reason": fin}]}).encode()
        + b"\n\n"
        for delta, fin in [({"role": "assistant"}, None), ({"reasoning": "be"}, None), ({"content": "yes"}, "stop")]
    )
    out = events(stream.feed(data + b"data: [DONE]\n\n"))
    starts = [d["content_block"]["type"] for k, d in out if k == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert [d["delta"]["type"] for k, d in out if k == "content_block_delta"] == ["thinking_delta", "text_delta"]


def test_a_stream_cut_before_it_finished_ends_with_an_error_event() -> None:
    data = stream_bytes("vllm", "chat_for_messages_stream")
    cut = data[: data.index(b'"finish_reason":"length"') - 200]
    stream = MessagesStream()
    out = events(stream.feed(cut) + stream.finish())
    assert out[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "The backend's stream ended before it finished."}},
    )
    assert "message_stop" not in [k for k, _ in out]


def test_an_upstream_error_event_is_relayed_in_anthropic_shape() -> None:
    stream = MessagesStream()
    out = events(stream.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\n') + stream.finish())
    assert out == [("error", {"type": "error", "error": {"type": "api_error", "message": "boom"}})]


def test_a_known_input_count_fills_message_start_when_the_engine_sends_no_early_usage() -> None:
    out = events(translate_stream("llamacpp", "messages_stream", input_tokens=17))
    assert out[0][1]["message"]["usage"] == {"input_tokens": 17, "output_tokens": 0}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["messages", "messages_tools", "messages_tool_result"])
def test_the_translated_request_is_the_same_prompt_on_the_real_engine(engine: str, name: str) -> None:
    """Same prompt tokens natively and translated: system, tools, tool_use and tool_result render
    through the chat template exactly as the engine's own Messages endpoint renders them."""
    native = load(engine, name)["body"]["usage"]
    chat = load(engine, f"chat_for_{name}")["body"]["usage"]
    assert native["input_tokens"] + native.get("cache_read_input_tokens", 0) == chat["prompt_tokens"]


@pytest.mark.parametrize("name", ["messages_count_tokens", "messages_count_tokens_system_tools"])
def test_count_tokens_through_vllms_tokenize_equals_its_native_count(name: str) -> None:
    """For a backend without count_tokens: vLLM's /tokenize (chat form) counted the translated
    request exactly as its native /v1/messages/count_tokens did."""
    assert count_tokens_to_tokenize(request_body("vllm", name)) == request_body("vllm", f"tokenize_for_{name}")
    assert load("vllm", f"tokenize_for_{name}")["body"]["count"] == load("vllm", name)["body"]["input_tokens"]
