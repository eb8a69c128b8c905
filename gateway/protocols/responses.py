"""OpenAI Responses (POST /v1/responses): native on engines whose table lists "responses" (vLLM,
SGLang), translated to and from chat completions elsewhere (llama.cpp, whose own Responses stream
breaks the openai SDK, and any other OpenAI-compatible server). A request naming a
previous_response_id is pinned to the backend that holds it (Inbound.pin)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from engines.adapters import adapter_for
from gateway.config import LimitsConfig
from gateway.errors import InvalidRequest
from gateway.protocols.base import Api, Inbound, SseObserver, StreamTransform, Target
from gateway.protocols.dropped import Dropped
from gateway.protocols.edits import NO_EDITS, Edits, apply_edits, needs_encoding
from gateway.protocols.inbound import STEERING_FIELDS, check_model, decode_json, positive_int
from gateway.protocols.native_observers import NativeObserver
from gateway.protocols.openai_errors import OpenAIErrors
from gateway.protocols.response_store import find_response_id
from gateway.protocols.responses_stream import ResponsesStream
from gateway.protocols.responses_translate import chat_to_response, encode, responses_to_chat, tool_names
from gateway.protocols.sse import StreamObserver

_NATIVE = Target("/v1/responses")
_TRANSLATED = Target("/v1/chat/completions", native=False)


class ResponsesProtocol(OpenAIErrors):
    """The ProtocolAdapter of POST /v1/responses."""

    __slots__ = ()
    api: Api = "responses"
    path = "/v1/responses"

    def parse(self, raw: bytes, limits: LimitsConfig) -> Inbound:
        body = decode_json(raw, limits.max_json_depth, limits.max_json_nodes, limits.max_json_containers)
        model = check_model(body)
        stream = body.get("stream") or False
        if not isinstance(stream, bool):
            raise InvalidRequest("'stream' must be a boolean.", param="stream", code="invalid_type")
        given = body.get("input")
        if not isinstance(given, str) and not (isinstance(given, list) and given):
            raise InvalidRequest("'input' must be a string or a non-empty array of items.", param="input")
        if isinstance(given, list) and len(given) > limits.max_messages:
            raise InvalidRequest(f"Too many input items ({len(given)} > {limits.max_messages}).", param="input")
        for field in ("instructions", "previous_response_id", "user"):
            if body.get(field) is not None and not isinstance(body[field], str):
                raise InvalidRequest(f"'{field}' must be a string.", param=field, code="invalid_type")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise InvalidRequest("'tools' must be an array.", param="tools", code="invalid_type")
        pin = body.get("previous_response_id")
        translated: dict[str, Any] | None = None
        dropped = Dropped()
        if pin is None:
            try:
                translated = responses_to_chat(body, dropped)
            except InvalidRequest:
                translated = None  # a native engine may still take it; target() refuses it elsewhere
        return Inbound(
            api="responses",
            raw=raw,
            body=body,
            model=model,
            stream=stream,
            include_usage=False,
            max_tokens=positive_int(body, "max_output_tokens"),
            max_tokens_field="max_output_tokens",
            n=1,
            messages=None,  # input items are not chat messages: truncate_oldest does not apply
            has_tools=bool(tools),
            user=_session(body),
            stripped=tuple(name for name in STEERING_FIELDS if name in body),
            translated=translated,
            dropped=tuple(dropped.names),
            pin=pin,
        )

    def estimate_view(self, inbound: Inbound) -> Mapping[str, Any] | None:
        """instructions + input as chat messages: the translation when there is one, else the text as it is
        (a pinned request: the stored conversation is the engine's to count)."""
        if inbound.translated is not None:
            return inbound.translated
        body = inbound.body
        given = body.get("input")
        messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
        text = given if isinstance(given, str) else json.dumps(given, ensure_ascii=False)
        return {"messages": [*messages, {"role": "user", "content": text}], "tools": body.get("tools")}

    def base_edits(self, inbound: Inbound) -> Edits:
        # No include_usage: a native stream ends with response.completed (usage in it), and the
        # translation asks its chat stream for usage itself.
        return Edits(drop_fields=inbound.stripped) if inbound.stripped else NO_EDITS

    def target(self, inbound: Inbound, engine: str) -> Target:
        if "responses" in adapter_for(engine).native_apis:
            return _NATIVE
        if inbound.translated is None:
            responses_to_chat(inbound.body)  # raises the 400 that says why it cannot be translated
            raise InvalidRequest("This request cannot be translated for this backend.", param="input")
        return _TRANSLATED

    def encode(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        if target.native:
            if not needs_encoding(edits, inbound.model, model):
                return inbound.raw
            return apply_edits(inbound.body, edits, "max_output_tokens", model)
        assert inbound.translated is not None
        return apply_edits(inbound.translated, edits, "max_tokens", model or inbound.model)

    def observer(self, inbound: Inbound, edits: Edits, target: Target) -> SseObserver:
        if target.native:
            return NativeObserver.responses()
        return StreamObserver(strip_usage=False, whole_events=True)

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        if target.native:
            return None
        return ResponsesStream(inbound.body, created_at=int(time.time()), names=tool_names(inbound.body))

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        if target.native:
            return raw
        names = tool_names(inbound.body)
        return encode(chat_to_response(parsed, inbound.body, created_at=int(time.time()), names=names))

    def answer_id(self, data: bytes) -> str | None:
        return find_response_id(data)

    def usage(self, parsed: Any) -> dict[str, Any] | None:
        usage = parsed.get("usage") if isinstance(parsed, dict) else None
        if not isinstance(usage, dict):
            return None
        if "input_tokens" in usage:  # a native Responses object: chat's names for accounting
            prompt, completion = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
            return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return usage

    def error_event(self, message: str, code: str) -> bytes:
        """OpenAI's Responses `error` event; no response.completed follows, so the SDK's
        get_final_response() tells a cut answer from a finished one."""
        event = {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


RESPONSES = ResponsesProtocol()


def _session(body: Mapping[str, Any]) -> str | None:
    """The body's session key: Codex's prompt_cache_key (its thread id), else user, else safety_identifier."""
    for name in ("prompt_cache_key", "user", "safety_identifier"):
        value = body.get(name)
        if isinstance(value, str) and value:
            return value
    return None
