"""The official anthropic and openai SDKs read the translators' output: translated bytes (from real
engines' chat answers, tests/fixtures/*/protocols/chat_for_*) are served by a tiny loopback HTTP
server, and the SDKs' own clients and stream parsers consume them."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.protocols.anthropic_errors import error_body_bytes, from_engine_error
from gateway.protocols.messages_reply import chat_to_message
from gateway.protocols.messages_stream import MessagesStream
from gateway.protocols.responses_stream import ResponsesStream
from gateway.protocols.responses_translate import chat_to_response
from tests.unit.protocol_fixtures import ENGINES, events, load, request_body, stream_bytes

pytestmark = pytest.mark.live


class Canned:
    """A loopback HTTP server that answers every POST/GET with the bytes it was last given."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b""
        self.content_type = "application/json"
        self.requests: list[dict[str, Any]] = []
        canned = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                canned.requests.append({"path": self.path, "body": json.loads(raw) if raw else None})
                self.send_response(canned.status)
                self.send_header("content-type", canned.content_type)
                self.send_header("content-length", str(len(canned.body)))
                self.end_headers()
                self.wfile.write(canned.body)

            do_POST = _answer
            do_GET = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, body: bytes, content_type: str = "application/json", status: int = 200) -> None:
        self.body, self.content_type, self.status = body, content_type, status

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture(scope="module")
def canned() -> Iterator[Canned]:
    server = Canned()
    yield server
    server.close()


def anthropic_client(server: Canned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="k", base_url=server.url, max_retries=0, timeout=10)


def openai_client(server: Canned) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url=server.url + "/v1", max_retries=0, timeout=10)


def translated_messages_stream(engine: str, name: str) -> bytes:
    stream = MessagesStream()
    return stream.feed(stream_bytes(engine, f"chat_for_{name}")) + stream.finish()


def translated_responses_stream(engine: str, name: str) -> bytes:
    stream = ResponsesStream(request_body(engine, name), created_at=1)
    return stream.feed(stream_bytes(engine, f"chat_for_{name}")) + stream.finish()


def sdk_args(engine: str, name: str) -> dict[str, Any]:
    """The recorded request's body as SDK keyword arguments (the SDKs' stream() sets stream itself)."""
    body = request_body(engine, name)
    body.pop("stream", None)
    return body


def chat_text(engine: str, name: str) -> str:
    chat = events(stream_bytes(engine, f"chat_for_{name}"))
    return "".join(c["delta"].get("content") or "" for _, d in chat for c in d["choices"])


def chat_usage(engine: str, name: str) -> dict[str, Any]:
    usage: dict[str, Any] = events(stream_bytes(engine, f"chat_for_{name}"))[-1][1]["usage"]
    return usage


@pytest.mark.parametrize("engine", ENGINES)
def test_the_anthropic_sdk_reads_a_translated_text_stream(canned: Canned, engine: str) -> None:
    canned.answer(translated_messages_stream(engine, "messages_stream"), "text/event-stream")
    with anthropic_client(canned).messages.stream(**sdk_args(engine, "messages_stream")) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == chat_text(engine, "messages_stream")
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == chat_usage(engine, "messages_stream")["completion_tokens"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"


def test_the_anthropic_sdk_reads_a_translated_tool_use_stream(canned: Canned) -> None:
    canned.answer(translated_messages_stream("vllm", "messages_tools_stream"), "text/event-stream")
    with anthropic_client(canned).messages.stream(**sdk_args("vllm", "messages_tools_stream")) as stream:
        final = stream.get_final_message()
    block = final.content[0]
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.input in ({"city": "Paris"}, {"city": "Rome"})
    assert final.stop_reason == "tool_use"


def test_the_anthropic_sdk_reads_a_translated_message(canned: Canned) -> None:
    chat = load("vllm", "chat_for_messages_tools")["body"]
    canned.answer(json.dumps(chat_to_message(chat)).encode())
    message = anthropic_client(canned).messages.create(**request_body("vllm", "messages_tools"))
    arguments = json.loads(chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert message.content[0].type == "tool_use" and message.content[0].input == arguments
    assert message.stop_reason == "tool_use"


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_context_error_reaches_the_anthropic_sdk_in_anthropic_shape(canned: Canned, engine: str) -> None:
    """llama.cpp answers OpenAI-shaped and vLLM says "BadRequestError"; normalised, the SDK raises
    BadRequestError with Anthropic's body."""
    record = load(engine, "error_messages_too_long")
    canned.answer(
        error_body_bytes(from_engine_error(record["status"], json.dumps(record["body"]).encode())), status=400
    )
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client(canned).messages.create(**request_body(engine, "error_messages_too_long"))
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "context" in body["error"]["message"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_openai_sdk_streams_a_translated_responses_stream(canned: Canned, engine: str) -> None:
    """llama.cpp's own Responses stream breaks this very call (recorded in llamacpp/protocols/sdk.json);
    the translation of its chat stream does not."""
    canned.answer(translated_responses_stream(engine, "responses_stream"), "text/event-stream")
    with openai_client(canned).responses.stream(**sdk_args(engine, "responses_stream")) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == chat_text(engine, "responses_stream")
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert (
        final.usage is not None
        and final.usage.output_tokens == chat_usage(engine, "responses_stream")["completion_tokens"]
    )
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"


def test_the_openai_sdk_streams_a_translated_function_call(canned: Canned) -> None:
    canned.answer(translated_responses_stream("vllm", "responses_tools_stream"), "text/event-stream")
    with openai_client(canned).responses.stream(**sdk_args("vllm", "responses_tools_stream")) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    call = final.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) in ({"city": "Paris"}, {"city": "Rome"})
    assert "response.function_call_arguments.delta" in kinds


def test_the_openai_sdk_reads_a_translated_response(canned: Canned) -> None:
    chat = load("vllm", "chat_for_responses_function_call_output")["body"]
    request = request_body("vllm", "responses_function_call_output")
    canned.answer(json.dumps(chat_to_response(chat, request, created_at=1)).encode())
    response = openai_client(canned).responses.create(**request)
    assert response.output_text == chat["choices"][0]["message"]["content"]
    assert response.usage is not None and response.usage.input_tokens == chat["usage"]["prompt_tokens"]
