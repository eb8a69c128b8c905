"""A recording proxy for coding agents: it forwards every request to a real engine (or to the gateway)
and saves what the agent put on the wire, and it can answer one generation request with a scripted
tool call, so that the agent runs the tool and sends its next request carrying the tool's result.

    python tests/agents/scripted.py --upstream http://127.0.0.1:8080 --port 9100 \\
        --record DIR [--tool-call Read:'{"file_path": "/tmp/x/hello.txt"}']

Each request is saved as DIR/NNN.json: {"method", "path", "query", "headers", "body"} (headers from
an allow-list: no credentials). The scripted answer is given to the first request that offers the named
tool, whose conversation has no tool result yet, and whose last user text contains ``TOOL_MARKER``; it is
written in the protocol of the request's path (Messages, Responses or chat completions), streamed or
not as asked. A tiny random-weight model never calls a tool by itself, and an agent's second turn is
what carries ``tool_result`` / ``function_call_output`` items: this is how a test gets one for real.

The proxy is test tooling, not part of the product; it runs under the test venv (starlette, httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

TOOL_MARKER = "use the tool"
"""A prompt containing this asks the proxy for its scripted tool call."""

SAVED_HEADERS = (
    "anthropic-beta",
    "anthropic-version",
    "openai-beta",
    "user-agent",
    "x-app",
    "x-claude-code-session-id",
    "session-id",
    "session_id",
    "thread-id",
    "conversation_id",
    "originator",
    "version",
    "content-type",
    "accept",
    "x-stainless-lang",
    "x-stainless-package-version",
    "x-stainless-runtime",
)
READY_PATH = "/__recorder/ready"
"""Answered by the proxy itself, unrecorded: how a test knows it listens."""
_HOP = frozenset({"host", "content-length", "connection", "transfer-encoding", "accept-encoding"})


@dataclass
class ScriptedCall:
    """One tool call to answer with: the tool's name as the agent offered it, and its arguments."""

    name: str
    arguments: dict[str, Any]
    given: bool = False


@dataclass
class Recorder:
    upstream: str
    folder: Path | None
    call: ScriptedCall | None
    count: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)

    def save(self, entry: dict[str, Any]) -> None:
        self.count += 1
        self.requests.append(entry)
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            text = json.dumps(entry, indent=1, ensure_ascii=False)
            (self.folder / f"{self.count:03d}.json").write_text(text + "\n")


def tool_names(body: Mapping[str, Any]) -> list[str]:
    """Every tool name a request offers (namespace tools' inner functions as namespace.name too)."""
    names: list[str] = []
    for tool in body.get("tools") or ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.append(function["name"])
        elif isinstance(tool.get("name"), str):
            names.append(tool["name"])
    return names


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    if isinstance(value, dict):
        if value.get("type") in ("tool_result", "function_call_output", "custom_tool_call_output"):
            return []
        return [t for key in ("text", "content", "input") for t in _texts(value.get(key))]
    return []


def _has_tool_result(body: Mapping[str, Any]) -> bool:
    history = body.get("messages") or body.get("input") or []
    if not isinstance(history, list):
        return False
    for item in history:
        if not isinstance(item, dict):
            continue
        if item.get("type") in ("function_call_output", "custom_tool_call_output") or item.get("role") == "tool":
            return True
        content = item.get("content")
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return True
    return False


def _last_user_text(body: Mapping[str, Any]) -> str:
    history = body.get("messages") or body.get("input") or []
    if isinstance(history, str):
        return history
    for item in reversed(history if isinstance(history, list) else []):
        if isinstance(item, dict) and item.get("role") == "user":
            return " ".join(_texts(item.get("content")))
    return ""


def wants_script(call: ScriptedCall | None, body: Any) -> bool:
    if call is None or call.given or not isinstance(body, dict):
        return False
    return call.name in tool_names(body) and not _has_tool_result(body) and TOOL_MARKER in _last_user_text(body)


def _sse(event: str | None, data: Mapping[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode()


def messages_answer(call: ScriptedCall, model: str, stream: bool) -> tuple[bytes, str]:
    block = {"type": "tool_use", "id": "toolu_scripted_1", "name": call.name, "input": call.arguments}
    usage = {"input_tokens": 10, "output_tokens": 10}
    message = {
        "id": "msg_scripted_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": usage,
    }
    if not stream:
        return json.dumps(message).encode(), "application/json"
    start = {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": 10, "output_tokens": 0}}
    events = [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}},
        ),
        _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)},
            },
        ),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": usage},
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(events), "text/event-stream"


def responses_answer(call: ScriptedCall, model: str, stream: bool) -> tuple[bytes, str]:
    item = {
        "type": "function_call",
        "id": "fc_scripted_1",
        "call_id": "call_scripted_1",
        "name": call.name,
        "arguments": json.dumps(call.arguments),
        "status": "completed",
    }
    usage = {"input_tokens": 10, "output_tokens": 10, "total_tokens": 20}
    response = {
        "id": "resp_scripted_1",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": [item],
        "usage": usage,
    }
    if not stream:
        return json.dumps(response).encode(), "application/json"
    created = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [
        _sse("response.created", {"type": "response.created", "sequence_number": 0, "response": created}),
        _sse(
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "sequence_number": 1,
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
        ),
        _sse(
            "response.output_item.done",
            {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": item},
        ),
        _sse("response.completed", {"type": "response.completed", "sequence_number": 3, "response": response}),
    ]
    return b"".join(events), "text/event-stream"


def chat_answer(call: ScriptedCall, model: str, stream: bool) -> tuple[bytes, str]:
    tool_call = {
        "id": "call_scripted_1",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }
    base = {"id": "chatcmpl-scripted", "created": int(time.time()), "model": model}
    usage = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
    if not stream:
        body = {
            **base,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": usage,
        }
        return json.dumps(body).encode(), "application/json"
    chunk = {**base, "object": "chat.completion.chunk"}
    delta = {"role": "assistant", "tool_calls": [{"index": 0, **tool_call}]}
    events = [
        _sse(None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        _sse(None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        _sse(None, {**chunk, "choices": [], "usage": usage}),
    ]
    return b"".join(events) + b"data: [DONE]\n\n", "text/event-stream"


def scripted_answer(call: ScriptedCall, path: str, body: Mapping[str, Any]) -> tuple[bytes, str] | None:
    model = str(body.get("model") or "")
    stream = body.get("stream") is True
    if path.endswith("/messages"):
        return messages_answer(call, model, stream)
    if path.endswith("/responses"):
        return responses_answer(call, model, stream)
    if path.endswith("/chat/completions"):
        return chat_answer(call, model, stream)
    return None


def build_app(recorder: Recorder) -> Starlette:
    client = httpx.AsyncClient(base_url=recorder.upstream, timeout=httpx.Timeout(600.0, connect=10.0))

    async def forward(request: Request) -> Response:
        if request.url.path == READY_PATH:
            return Response(b"ok")
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k: v for k, v in request.headers.items() if k in SAVED_HEADERS}
        recorder.save(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "headers": headers,
                "body": body,
            }
        )
        if wants_script(recorder.call, body):
            assert recorder.call is not None and isinstance(body, dict)
            answer = scripted_answer(recorder.call, request.url.path, body)
            if answer is not None:
                recorder.call.given = True
                return Response(answer[0], media_type=answer[1])
        upstream_headers = {k: v for k, v in request.headers.items() if k not in _HOP}
        url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        upstream = client.build_request(request.method, url, content=raw, headers=upstream_headers)
        reply = await client.send(upstream, stream=True)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in reply.aiter_raw():
                    yield piece
            finally:
                await reply.aclose()

        out_headers = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP | {"content-encoding"}}
        return StreamingResponse(relay(), status_code=reply.status_code, headers=out_headers)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def parse_call(text: str | None) -> ScriptedCall | None:
    if not text:
        return None
    name, _, arguments = text.partition(":")
    value = json.loads(arguments) if arguments else {}
    if not isinstance(value, dict):
        raise SystemExit("--tool-call: the arguments must be a JSON object")
    return ScriptedCall(name, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, default=None, help="a folder for the requests (NNN.json)")
    parser.add_argument("--tool-call", default=None, help='NAME:{"json": "arguments"}, answered once')
    args = parser.parse_args()
    recorder = Recorder(args.upstream.rstrip("/"), args.record, parse_call(args.tool_call))
    config = uvicorn.Config(build_app(recorder), host=args.host, port=args.port, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
