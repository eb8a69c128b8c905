"""Record the Anthropic Messages, OpenAI Responses and tokenize exchanges of REAL engines into
tests/fixtures/<engine>/protocols/, then run the official ``anthropic`` and ``openai`` SDKs against
the same servers and save what they make of each answer (``sdk.json``).

Usage: python3 tests/engines/record_protocols.py [llamacpp|vllm|sglang|all] [--url URL] [--out tests/fixtures]
(``--url`` records from a server already running; otherwise one is started with the integration
tier's settings. vLLM is started with ``--enable-auto-tool-choice --tool-call-parser pythonic``:
without a parser it refuses any ``tool_choice``; the flags change nothing for requests without tools.)

The file format is record_fixtures.py's (NAME.json, streams as exact bytes in NAME.sse.txt). The raw
exchanges use the standard library; the SDK pass needs ``pip install anthropic openai``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import servers
from record_fixtures import TOO_LONG_PROMPT, Recorder, Reply, decode_body, request

MODEL = servers.MODEL_NAME
VLLM_TOOL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic")
USER = "Say something about the gateway."
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather for a city", "input_schema": CITY_SCHEMA}]
RESPONSES_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather for a city", "parameters": CITY_SCHEMA}
]


class UrlServer:
    """Enough of servers.EngineServer for Recorder when the server is already running."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.base_url = f"http://{self.host}:{self.port}"


def record_messages(rec: Recorder) -> None:
    base = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": USER}]}
    rec.record("messages", "POST", "/v1/messages", {**base, "system": "You are a test."})
    blocks = {
        "model": MODEL,
        "max_tokens": 8,
        "system": [{"type": "text", "text": "You are a test."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
            {"role": "user", "content": [{"type": "text", "text": USER}]},
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "stop_sequences": ["\n\n\n"],
        "metadata": {"user_id": "user-1"},
    }
    rec.record("messages_blocks", "POST", "/v1/messages", blocks)
    rec.record_stream("messages_stream", "/v1/messages", {**base, "max_tokens": 5, "stream": True})
    tools = {
        **base,
        "max_tokens": 40,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    rec.record("messages_tools", "POST", "/v1/messages", tools)
    rec.record_stream("messages_tools_stream", "/v1/messages", {**tools, "stream": True})
    rec.record("messages_tools_any", "POST", "/v1/messages", {**tools, "tool_choice": {"type": "any"}})
    rec.record("messages_tools_auto", "POST", "/v1/messages", {**tools, "tool_choice": {"type": "auto"}})
    history = {
        "model": MODEL,
        "max_tokens": 8,
        "tools": ANTHROPIC_TOOLS,
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny, 21 C"}]},
        ],
    }
    rec.record("messages_tool_result", "POST", "/v1/messages", history)
    count = {"model": MODEL, "messages": base["messages"]}
    rec.record("messages_count_tokens", "POST", "/v1/messages/count_tokens", count)
    rec.record(
        "messages_count_tokens_system_tools",
        "POST",
        "/v1/messages/count_tokens",
        {**count, "system": "You are a test.", "tools": ANTHROPIC_TOOLS},
    )
    long_messages = [{"role": "user", "content": TOO_LONG_PROMPT}]
    rec.record("messages_count_tokens_long", "POST", "/v1/messages/count_tokens", {**count, "messages": long_messages})
    rec.record("error_messages_too_long", "POST", "/v1/messages", {**base, "messages": long_messages})
    rec.record_stream(
        "error_messages_too_long_stream", "/v1/messages", {**base, "messages": long_messages, "stream": True}
    )
    rec.record(
        "error_messages_missing_max_tokens", "POST", "/v1/messages", {"model": MODEL, "messages": base["messages"]}
    )
    rec.record("error_messages_unknown_model", "POST", "/v1/messages", {**base, "model": "no-such-model"})


def record_responses(rec: Recorder) -> None:
    base = {"model": MODEL, "input": USER, "max_output_tokens": 8}
    first = rec.record("responses", "POST", "/v1/responses", {**base, "instructions": "You are a test."})
    items = {
        "model": MODEL,
        "max_output_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
            {"role": "user", "content": USER},
        ],
    }
    rec.record("responses_items", "POST", "/v1/responses", items)
    rec.record_stream("responses_stream", "/v1/responses", {**base, "max_output_tokens": 5, "stream": True})
    first_id = _field(first, "id")
    if first_id:
        rec.record("responses_get", "GET", f"/v1/responses/{first_id}")
        rec.record(
            "responses_previous",
            "POST",
            "/v1/responses",
            {**base, "input": "And more?", "previous_response_id": first_id},
        )
        rec.record("responses_cancel_completed", "POST", f"/v1/responses/{first_id}/cancel")
    stored = rec.record("responses_store", "POST", "/v1/responses", {**base, "store": True})
    stored_id = _field(stored, "id")
    if stored_id:
        rec.record("responses_store_get", "GET", f"/v1/responses/{stored_id}")
        rec.record(
            "responses_store_previous",
            "POST",
            "/v1/responses",
            {**base, "input": "And more?", "previous_response_id": stored_id},
        )
    tools = {
        **base,
        "max_output_tokens": 40,
        "input": "What is the weather in Paris?",
        "tools": RESPONSES_TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    rec.record("responses_tools", "POST", "/v1/responses", tools)
    rec.record_stream("responses_tools_stream", "/v1/responses", {**tools, "stream": True})
    rec.record("responses_tools_required", "POST", "/v1/responses", {**tools, "tool_choice": "required"})
    outputs = {
        "model": MODEL,
        "max_output_tokens": 8,
        "tools": RESPONSES_TOOLS,
        "input": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": "call_01", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_01", "output": "Sunny, 21 C"},
        ],
    }
    rec.record("responses_function_call_output", "POST", "/v1/responses", outputs)
    rec.record("error_responses_get_unknown", "GET", "/v1/responses/resp_doesnotexist")
    rec.record(
        "error_responses_previous_unknown",
        "POST",
        "/v1/responses",
        {**base, "previous_response_id": "resp_doesnotexist"},
    )
    rec.record("error_responses_too_long", "POST", "/v1/responses", {**base, "input": TOO_LONG_PROMPT})
    rec.record_stream(
        "error_responses_too_long_stream", "/v1/responses", {**base, "input": TOO_LONG_PROMPT, "stream": True}
    )
    rec.record("error_responses_unknown_model", "POST", "/v1/responses", {**base, "model": "no-such-model"})


def record_stored(rec: Recorder) -> None:
    """Responses state on a vLLM started with VLLM_ENABLE_RESPONSES_API_STORE=1 (off by default)."""
    base = {"model": MODEL, "input": USER, "max_output_tokens": 8}
    first = rec.record("stored_responses", "POST", "/v1/responses", {**base, "instructions": "You are a test."})
    first_id = _field(first, "id")
    if not first_id:
        return
    rec.record("stored_get", "GET", f"/v1/responses/{first_id}")
    follow = {**base, "input": "And more?", "previous_response_id": first_id}
    rec.record("stored_previous", "POST", "/v1/responses", follow)
    rec.record_stream("stored_previous_stream", "/v1/responses", {**follow, "max_output_tokens": 3, "stream": True})
    rec.record("stored_cancel_completed", "POST", f"/v1/responses/{first_id}/cancel")
    background = rec.record("stored_background", "POST", "/v1/responses", {**base, "background": True, "store": True})
    background_id = _field(background, "id")
    if background_id:
        rec.record("stored_background_cancel", "POST", f"/v1/responses/{background_id}/cancel")
        rec.record("stored_background_get", "GET", f"/v1/responses/{background_id}")
    rec.record("stored_error_get_unknown", "GET", "/v1/responses/resp_doesnotexist")
    rec.record("stored_error_previous_unknown", "POST", "/v1/responses", {**base, "previous_response_id": "resp_nope"})


# Native exchanges whose request is also sent translated to /v1/chat/completions, as chat_for_NAME:
# the translators' unit tests turn those chat answers back and compare them with the native ones.
TRANSLATED = {
    "messages": "messages",
    "messages_stream": "messages",
    "messages_tools": "messages",
    "messages_tools_stream": "messages",
    "messages_tool_result": "messages",
    "responses": "responses",
    "responses_stream": "responses",
    "responses_tools": "responses",
    "responses_tools_stream": "responses",
    "responses_function_call_output": "responses",
}


def record_translated(rec: Recorder) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gateway.protocols.messages_translate import count_tokens_to_tokenize, messages_to_chat
    from gateway.protocols.responses_translate import responses_to_chat

    for name, protocol in TRANSLATED.items():
        native = json.loads((rec.out / f"{name}.json").read_text())["request"]["body"]
        chat = messages_to_chat(native) if protocol == "messages" else responses_to_chat(native)
        if chat.get("stream"):
            rec.record_stream(f"chat_for_{name}", "/v1/chat/completions", chat)
        else:
            rec.record(f"chat_for_{name}", "POST", "/v1/chat/completions", chat)
    for name in ("messages_count_tokens", "messages_count_tokens_system_tools"):
        native = json.loads((rec.out / f"{name}.json").read_text())["request"]["body"]
        rec.record(f"tokenize_for_{name}", "POST", "/tokenize", count_tokens_to_tokenize(native))


def record_tokenize(rec: Recorder) -> None:
    tok = rec.record("tokenize_prompt", "POST", "/tokenize", {"model": MODEL, "prompt": "The gateway routes"})
    rec.record(
        "tokenize_messages", "POST", "/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": USER}]}
    )
    rec.record("tokenize_content", "POST", "/tokenize", {"content": "The gateway routes"})
    tokens = _field(tok, "tokens") or [1, 2, 3]
    rec.record("detokenize", "POST", "/detokenize", {"model": MODEL, "tokens": tokens})


def _field(reply: Reply, key: str) -> Any:
    body = decode_body(reply)
    return body.get(key) if isinstance(body, dict) and reply.status == 200 else None


def _sdk_case(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    try:
        results[name] = {"ok": True, "result": fn()}
    except Exception as exc:  # the point is to record what the SDK raises
        body = getattr(exc, "body", None)
        results[name] = {
            "ok": False,
            "exception": f"{type(exc).__module__}.{type(exc).__name__}",
            "message": str(exc)[:500],
            "status": getattr(exc, "status_code", None),
            "body": body if isinstance(body, dict | list | str) else None,
            "where": traceback.format_exception(exc)[-2].strip()[:300],
        }
    print(f"  sdk {name}: {'ok' if results[name]['ok'] else results[name]['exception']}")


def run_sdks(base_url: str, out: Path) -> None:
    """What the official SDKs make of the engine's native endpoints."""
    import anthropic
    import openai

    results: dict[str, Any] = {"anthropic": anthropic.__version__, "openai": openai.__version__}
    ac = anthropic.Anthropic(base_url=base_url, api_key="not-checked", max_retries=0, timeout=60)
    msgs: Any = [{"role": "user", "content": USER}]
    tools: Any = ANTHROPIC_TOOLS
    _sdk_case(
        results, "messages_create", lambda: ac.messages.create(model=MODEL, max_tokens=8, messages=msgs).to_dict()
    )

    def stream() -> Any:
        with ac.messages.stream(model=MODEL, max_tokens=5, messages=msgs) as s:
            kinds = [event.type for event in s]
            return {"events": kinds, "final": s.get_final_message().to_dict()}

    _sdk_case(results, "messages_stream", stream)
    _sdk_case(
        results,
        "messages_tools",
        lambda: ac.messages.create(
            model=MODEL,
            max_tokens=40,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=tools,
            tool_choice={"type": "tool", "name": "get_weather"},
        ).to_dict(),
    )
    _sdk_case(results, "count_tokens", lambda: ac.messages.count_tokens(model=MODEL, messages=msgs).to_dict())
    long_msgs: Any = [{"role": "user", "content": TOO_LONG_PROMPT}]
    _sdk_case(results, "messages_too_long", lambda: ac.messages.create(model=MODEL, max_tokens=8, messages=long_msgs))

    oc = openai.OpenAI(base_url=base_url + "/v1", api_key="not-checked", max_retries=0, timeout=60)
    created: dict[str, Any] = {}

    def create() -> Any:
        resp = oc.responses.create(model=MODEL, input=USER, max_output_tokens=8)
        created["id"] = resp.id
        return resp.to_dict()

    _sdk_case(results, "responses_create", create)

    def rstream() -> Any:
        with oc.responses.stream(model=MODEL, input=USER, max_output_tokens=5) as s:
            kinds = [event.type for event in s]
            return {"events": kinds, "final": s.get_final_response().to_dict()}

    _sdk_case(results, "responses_stream", rstream)
    if "id" in created:
        _sdk_case(results, "responses_retrieve", lambda: oc.responses.retrieve(created["id"]).to_dict())
        _sdk_case(
            results,
            "responses_previous",
            lambda: oc.responses.create(
                model=MODEL, input="And more?", max_output_tokens=8, previous_response_id=created["id"]
            ).to_dict(),
        )
    _sdk_case(
        results,
        "responses_too_long",
        lambda: oc.responses.create(model=MODEL, input=TOO_LONG_PROMPT, max_output_tokens=8),
    )
    (out / "sdk.json").write_text(json.dumps(results, indent=2, ensure_ascii=False, default=str) + "\n")


def record_engine(kind: str, out_root: Path, url: str | None) -> None:
    out = out_root / kind / "protocols"
    print(f"== {kind} -> {out}")
    started = None
    if url is None:
        if kind == "vllm":
            started = servers.start_vllm(extra_args=VLLM_TOOL_ARGS)
        elif kind == "sglang":
            started = servers.start_sglang()
        else:
            started = servers.start_llamacpp()
        server: Any = started
    else:
        server = UrlServer(url)
    try:
        rec = Recorder(server, out)
        record_messages(rec)
        record_responses(rec)
        record_tokenize(rec)
        record_translated(rec)
        version = request(server, "GET", "/version") if kind == "vllm" else request(server, "GET", "/props")
        rec.save_json(
            "meta",
            {
                "engine": kind,
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": started.command if started is not None else f"already running at {url}",
                "version": decode_body(version) if kind == "vllm" else _build_info(version),
                "tool_args": list(VLLM_TOOL_ARGS) if kind == "vllm" else [],
            },
        )
        run_sdks(server.base_url, out)
    finally:
        if started is not None:
            started.stop()


def _build_info(reply: Reply) -> Any:
    body = decode_body(reply)
    return body.get("build_info") if isinstance(body, dict) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=["llamacpp", "vllm", "sglang", "all"])
    parser.add_argument("--url", help="record from a server already running at this base URL")
    parser.add_argument("--translated", action="store_true", help="only the chat_for_* exchanges")
    parser.add_argument("--stored", action="store_true", help="only the stored_* exchanges (vLLM with the store on)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "fixtures")
    args = parser.parse_args()
    if args.translated:
        record_translated(Recorder(cast(Any, UrlServer(args.url)), args.out / args.engine / "protocols"))
        return
    if args.stored:
        record_stored(Recorder(cast(Any, UrlServer(args.url)), args.out / args.engine / "protocols"))
        return
    kinds = ["llamacpp", "vllm"] if args.engine == "all" else [args.engine]
    for kind in kinds:
        record_engine(kind, args.out, args.url if len(kinds) == 1 else None)


if __name__ == "__main__":
    main()
