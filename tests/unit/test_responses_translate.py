"""OpenAI Responses <-> chat translation, checked against real vLLM 0.32's native Responses answers
(tests/fixtures/vllm/protocols; each native request was also sent, translated, to the engine's
/v1/chat/completions as chat_for_NAME). The openai SDK reads the output in
tests/live/test_protocol_sdks.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.protocols.dropped import Dropped
from gateway.protocols.responses_stream import ResponsesStream
from gateway.protocols.responses_translate import chat_to_response, response_text, responses_to_chat, tool_names
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

TRANSLATED = (
    "responses",
    "responses_stream",
    "responses_tools",
    "responses_tools_stream",
    "responses_function_call_output",
)
# vLLM's own additions to OpenAI's Response object, and OpenAI's keys that vLLM leaves out.
VLLM_ONLY = {
    "background", "max_tool_calls", "prompt", "service_tier", "top_logprobs", "presence_penalty",
    "frequency_penalty", "kv_transfer_params", "ec_transfer_params", "input_messages", "output_messages",
    "phase", "async", "caller", "namespace", "input_tokens_per_turn", "cached_tokens_per_turn",
    "cache_write_tokens", "tool_output_tokens", "output_tokens_per_turn", "tool_output_tokens_per_turn",
    "allowed_callers", "defer_loading", "output_schema", "strict", "description",
}  # fmt: skip
OPENAI_ONLY = {"error", "store"}


def leaf(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def translate_stream(engine: str, name: str, seed: int = 0) -> bytes:
    stream = ResponsesStream(request_body(engine, name), created_at=1)
    return feed_in_pieces(stream.feed, stream_bytes(engine, f"chat_for_{name}"), seed) + stream.finish()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", TRANSLATED)
def test_the_recorded_chat_requests_are_this_translation(engine: str, name: str) -> None:
    assert responses_to_chat(request_body(engine, name)) == request_body(engine, f"chat_for_{name}")


def echoed_text_setting(path: str) -> bool:
    """``text`` echoes the request's output format: vLLM says null (or its own tool-calling schema),
    OpenAI ``{"format": {"type": "text"}}``, as the translation does."""
    return path.startswith(("text.", "response.text."))


def assert_same_keys(ours: set[str], native: set[str]) -> None:
    assert {p for p in native - ours if leaf(p) not in VLLM_ONLY and not echoed_text_setting(p)} == set()
    assert {p for p in ours - native if leaf(p) not in OPENAI_ONLY and not echoed_text_setting(p)} == set()


@pytest.mark.parametrize("name", ["responses", "responses_tools", "responses_function_call_output"])
def test_a_translated_response_has_vllms_native_shape(name: str) -> None:
    native = load("vllm", name)["body"]
    ours = chat_to_response(load("vllm", f"chat_for_{name}")["body"], request_body("vllm", name), created_at=1)
    assert_same_keys(key_paths(ours), key_paths(native))
    assert [i["type"] for i in ours["output"]] == [i["type"] for i in native["output"]]
    assert (ours["status"], ours["incomplete_details"]) == (native["status"], native["incomplete_details"])
    assert ours["id"].startswith("resp_")


def test_a_forced_function_call_becomes_a_function_call_item() -> None:
    chat = load("vllm", "chat_for_responses_tools")["body"]
    call = chat["choices"][0]["message"]["tool_calls"][0]
    ours = chat_to_response(chat, request_body("vllm", "responses_tools"), created_at=1)
    item = ours["output"][0]
    assert (item["type"], item["call_id"], item["name"], item["arguments"]) == (
        "function_call",
        call["id"],
        "get_weather",
        call["function"]["arguments"],
    )
    assert item["id"].startswith("fc_") and item["status"] == "completed"
    usage = chat["usage"]
    assert ours["usage"]["input_tokens"] == usage["prompt_tokens"]
    assert ours["usage"]["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("name", ["responses_stream", "responses_tools_stream"])
def test_a_translated_stream_has_vllms_native_event_sequence_and_keys(name: str) -> None:
    native = events(stream_bytes("vllm", name))
    ours = events(translate_stream("vllm", name))
    assert squeeze(str(k) for k, _ in ours) == squeeze(str(k) for k, _ in native)
    assert [d["sequence_number"] for _, d in ours] == list(range(len(ours)))
    for kind, data in ours:
        assert kind == data["type"]
        native_keys = set().union(*(key_paths(d) for k, d in native if k == kind))
        assert_same_keys(key_paths(data), native_keys)


def test_llamacpps_broken_native_stream_lacks_what_the_translation_has() -> None:
    """llama.cpp's own /v1/responses stream has no sequence_number, output_index or content_index
    (the openai SDK fails on it: llamacpp/protocols/sdk.json); its translated chat stream has them."""
    native = events(stream_bytes("llamacpp", "responses_stream"))
    assert all("sequence_number" not in d for _, d in native)
    sdk = json.loads((load.__globals__["FIXTURES"] / "llamacpp" / "protocols" / "sdk.json").read_text())
    assert sdk["responses_stream"]["exception"] == "builtins.TypeError"
    ours = events(translate_stream("llamacpp", "responses_stream"))
    assert squeeze(str(k) for k, _ in ours) == squeeze(
        str(k) for k, _ in events(stream_bytes("vllm", "responses_stream"))
    )
    deltas = [d for k, d in ours if k == "response.output_text.delta"]
    assert deltas and all({"output_index", "content_index", "sequence_number"} <= d.keys() for d in deltas)


@pytest.mark.parametrize("seed", range(4))
def test_the_stream_text_and_usage_match_the_chat_stream_at_any_split(seed: int) -> None:
    ours = events(translate_stream("vllm", "responses_stream", seed))
    chat = events(stream_bytes("vllm", "chat_for_responses_stream"))
    text = "".join(c["delta"].get("content") or "" for _, d in chat for c in d["choices"])
    assert "".join(d["delta"] for k, d in ours if k == "response.output_text.delta") == text
    completed = ours[-1][1]["response"]
    assert response_text(completed) == text
    assert completed["status"] == "incomplete" and completed["incomplete_details"] == {"reason": "max_output_tokens"}
    assert completed["usage"]["output_tokens"] == chat[-1][1]["usage"]["completion_tokens"]
    ids = {d["response"]["id"] for k, d in ours if "response" in d}
    assert len(ids) == 1


def test_instructions_items_and_function_call_outputs() -> None:
    chat = responses_to_chat(request_body("vllm", "responses_items"))
    assert chat["messages"] == [
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Say something about the gateway."},
    ]
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"]) == (8, 0.5, 0.9)
    chat = responses_to_chat(request_body("vllm", "responses_function_call_output"))
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_01",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_01", "content": "Sunny, 21 C"},
    ]
    assert chat["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": request_body("vllm", "responses_tools")["tools"][0]["parameters"],
            "description": "Weather for a city",
        },
    }


def test_parallel_function_calls_share_one_assistant_turn_and_developer_joins_the_system_turn() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_image", "image_url": "data:x"}],
            },
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}},
        "stream": True,
    }
    chat = responses_to_chat(body)
    # One system turn at the head: many chat templates refuse a second one.
    assert [m["role"] for m in chat["messages"]] == ["system", "assistant", "tool", "user"]
    assert chat["messages"][0]["content"] == "Be brief.\n\nRules."
    assert [c["id"] for c in chat["messages"][1]["tool_calls"]] == ["a", "b"]
    assert chat["messages"][3]["content"][1] == {"type": "image_url", "image_url": {"url": "data:x"}}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": True},
    }
    assert chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "body",
    [
        {"input": []},
        {"input": 3},
        {"input": "x", "previous_response_id": "resp_1"},
        {"input": [{"role": "tool", "content": "x"}]},
        {"input": "x", "instructions": ["x"]},
    ],
)
def test_a_request_that_cannot_be_served_at_all_is_an_invalid_request(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        responses_to_chat({"model": "m", **body})


@pytest.mark.parametrize(
    ("body", "dropped"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}, {"role": "user", "content": "x"}]}, ["item_reference"]),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_file"}]}]},
            ["input_file"],
        ),
        ({"input": "x", "tools": [{"type": "web_search"}]}, ["web_search"]),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, []),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, ["text.format"]),
        (
            {"input": "x", "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"]},
            ["reasoning", "reasoning.encrypted_content"],
        ),
        ({"input": "x", "store": False, "prompt_cache_key": "k", "client_metadata": {"a": "b"}}, []),
        (
            {"input": [{"type": "compaction", "encrypted_content": "e"}, {"role": "user", "content": "x"}]},
            ["compaction"],
        ),
    ],
)
def test_what_chat_cannot_express_is_dropped_and_named(body: dict[str, Any], dropped: list[str]) -> None:
    lost = Dropped()
    chat = responses_to_chat({"model": "m", **body}, lost)
    assert lost.names == dropped
    assert chat["messages"][-1] == {"role": "user", "content": "x"}
    assert set(chat) <= {"model", "messages", "tools", "tool_choice", "response_format"}


CODEX_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": False},
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object"}}],
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Patch files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"},
    },
    {"type": "web_search", "external_web_access": False},
]


def test_namespace_and_custom_tools_become_functions_and_come_back_by_their_own_names() -> None:
    body: dict[str, Any] = {
        "model": "gpt-5.2-codex",
        "instructions": None,
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thought"}], "encrypted_content": "e"},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "close_agent",
                "namespace": "multi_agent_v1",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "closed"}]},
            {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
        ],
    }
    lost = Dropped()
    chat = responses_to_chat(body, lost)
    names = [t["function"]["name"] for t in chat["tools"]]
    assert names == ["exec_command", "multi_agent_v1__close_agent", "apply_patch"]
    assert chat["tools"][2]["function"]["parameters"]["required"] == ["input"]
    assert "start: x" in chat["tools"][2]["function"]["description"]
    assert lost.names == ["web_search", "reasoning.encrypted_content"]
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert chat["messages"][2]["reasoning"] == "thought"
    assert chat["messages"][2]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"
    assert chat["messages"][3]["content"] == "closed"
    assert json.loads(chat["messages"][4]["tool_calls"][0]["function"]["arguments"]) == {"input": "*** Begin Patch"}

    answer = {
        "model": "tiny",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "k1", "function": {"name": "multi_agent_v1__close_agent", "arguments": "{}"}},
                        {"id": "k2", "function": {"name": "apply_patch", "arguments": '{"input": "*** End Patch"}'}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
    }
    response = chat_to_response(answer, body, created_at=1, names=tool_names(body))
    assert response["model"] == "gpt-5.2-codex", "the client's name, not the engine's"
    first, second = response["output"]
    assert (first["type"], first["name"], first["namespace"]) == ("function_call", "close_agent", "multi_agent_v1")
    assert (second["type"], second["name"], second["input"]) == ("custom_tool_call", "apply_patch", "*** End Patch")


def test_the_stream_restores_namespaces_and_custom_tool_calls() -> None:
    body: dict[str, Any] = {"model": "client-name", "tools": CODEX_TOOLS, "input": "go", "stream": True}
    stream = ResponsesStream(body, created_at=1, names=tool_names(body))
    chunks = [
        {
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "k1",
                                "function": {"name": "multi_agent_v1__close_agent", "arguments": "{}"},
                            }
                        ]
                    },
                }
            ],
        },
        {
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 1, "id": "k2", "function": {"name": "apply_patch", "arguments": '{"input": '}}
                        ]
                    },
                }
            ],
        },
        {
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 1, "function": {"arguments": '"patch"}'}}]},
                    "finish_reason": "tool_calls",
                }
            ],
        },
    ]
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    events = [
        json.loads(line[6:])
        for line in (stream.feed(raw) + stream.finish()).decode().splitlines()
        if line.startswith("data: ")
    ]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["namespace"] == "multi_agent_v1" and done[0]["name"] == "close_agent"
    assert done[1] == {
        "type": "custom_tool_call",
        "id": done[1]["id"],
        "call_id": "k2",
        "name": "apply_patch",
        "input": "patch",
        "status": "completed",
    }
    assert not any(
        e["type"] == "response.function_call_arguments.delta" and e["item_id"] == done[1]["id"] for e in events
    )
    completed = events[-1]["response"]
    assert completed["model"] == "client-name"
    assert [i["type"] for i in completed["output"]] == ["function_call", "custom_tool_call"]


def test_reasoning_streams_as_a_reasoning_item_before_the_message() -> None:
    stream = ResponsesStream({"model": "m"}, created_at=1)
    chunks = [({"role": "assistant", "content": ""}, None), ({"reasoning": "think"}, None), ({"content": "ok"}, "stop")]
    data = b"".join(
        b"data: "
        + json.dumps({"id": "c", "model": "m", "choices": [{"delta": d, "finish_reason": f}]}).encode()
        + b"\n\n"
        for d, f in chunks
    )
    out = events(stream.feed(data + b"data: [DONE]\n\n"))
    added = [d["item"]["type"] for k, d in out if k == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    final = out[-1][1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "think"


def test_a_stream_cut_before_it_finished_ends_failed() -> None:
    data = stream_bytes("vllm", "chat_for_responses_stream")
    stream = ResponsesStream({"model": "m"}, created_at=1)
    out = events(stream.feed(data[: data.index(b'"finish_reason":"length"') - 200]) + stream.finish())
    assert out[-1][0] == "response.failed"
    assert out[-1][1]["response"]["status"] == "failed" and out[-1][1]["response"]["error"]["code"] == "server_error"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["responses", "responses_tools", "responses_function_call_output"])
def test_the_translated_request_is_the_same_prompt_on_the_real_engine(engine: str, name: str) -> None:
    """Same prompt tokens natively and translated (instructions, function tools, function_call and
    function_call_output items), on vLLM and on llama.cpp."""
    assert (
        load(engine, name)["body"]["usage"]["input_tokens"]
        == load(engine, f"chat_for_{name}")["body"]["usage"]["prompt_tokens"]
    )
