"""Anthropic Messages (POST /v1/messages and /v1/messages/count_tokens) as protocol adapters: native
on an engine whose table lists "messages" / "count_tokens" (bytes pass through, errors normalised to
Anthropic's shape), translated to and from chat completions on every other engine."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mypy_extensions import mypyc_attr

from engines.adapters import ADAPTERS
from gateway.config import LimitsConfig
from gateway.errors import GatewayError, InvalidRequest, UpstreamError
from gateway.protocols.anthropic_errors import error_body, error_body_bytes, from_gateway_error
from gateway.protocols.base import Api, Inbound, SseObserver, StreamTransform, Target
from gateway.protocols.dropped import Dropped
from gateway.protocols.edits import NO_EDITS, Edits, apply_edits, needs_encoding
from gateway.protocols.frames import encode_event
from gateway.protocols.inbound import STEERING_FIELDS, _length_limit, decode_json
from gateway.protocols.messages_native import fix_native
from gateway.protocols.messages_reply import chat_to_message
from gateway.protocols.messages_stream import MessagesStream
from gateway.protocols.messages_translate import count_tokens_body, messages_to_chat, metadata_session
from gateway.protocols.native_observers import NativeObserver
from gateway.protocols.sse import StreamObserver

_MAX_MODEL_CHARS = 256
_MAX_INT = 2**31 - 1
_CHAT = "/v1/chat/completions"


def _natives(api: str) -> frozenset[str]:
    """The engine kinds that serve `api` themselves, from each engine adapter's table."""
    return frozenset(kind for kind, adapter in ADAPTERS.items() if api in adapter.native_apis)


def _native_targets(api: str, path: str) -> dict[str, Target]:
    """The native target of each engine kind that serves `api`, with the fixes its body needs there."""
    return {kind: Target(path, fixes=ADAPTERS[kind].native_fixes) for kind in _natives(api)}


@mypyc_attr(allow_interpreted_subclasses=True)  # a base for adapters of your own
class AnthropicProtocol:
    """What both Messages endpoints share: parsing, errors in Anthropic's shape, the native choice."""

    api: Api = "messages"
    path: str
    _native_api: str
    _length_field: str | None = "max_tokens"

    def __init__(self) -> None:
        self._native_kinds = _natives(self._native_api)
        self._targets = _native_targets(self._native_api, self.path)

    def parse(self, raw: bytes, limits: LimitsConfig) -> Inbound:
        body = decode_json(raw, limits.max_json_depth, limits.max_json_nodes, limits.max_json_containers)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model: is required and must be a string.", param="model", code="invalid_type")
        if len(model) > _MAX_MODEL_CHARS or not model.isprintable():
            raise InvalidRequest("model: is too long or has control characters.", param="model", code="invalid_value")
        messages = body.get("messages")
        if isinstance(messages, list) and len(messages) > limits.max_messages:
            raise InvalidRequest(
                f"messages: too many ({len(messages)} > {limits.max_messages}).",
                param="messages",
                code="too_many_messages",
            )
        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise InvalidRequest("stream: must be a boolean.", param="stream", code="invalid_type")
        max_tokens = self._max_tokens(body)
        length_fields: tuple[str, ...] = ()
        if max_tokens is not None:
            # An engine's own length field (llama.cpp's n_predict, ...) passes through natively: the cap
            # sees the largest, and a clamp writes them all (docs/reliability.md defect 6).
            largest, length_fields = _length_limit(body)
            max_tokens = max(max_tokens, largest or 0)
        # The chat form is what the estimate, the prefix fingerprint and the translated path read. It
        # never refuses a block it does not know: a native engine gets the client's body as it is.
        dropped = Dropped()
        chat = messages_to_chat(body, dropped)
        tools = body.get("tools")
        return Inbound(
            api="messages",
            raw=raw,
            body=body,
            model=model,
            stream=stream,
            include_usage=True,  # a Messages stream carries its usage itself
            max_tokens=max_tokens,
            max_tokens_field="max_tokens" if max_tokens is not None else None,
            n=1,
            messages=None,  # truncate_oldest is not offered on Messages: an over-cap request is rejected
            has_tools=bool(tools),
            user=metadata_session(body.get("metadata")),
            stripped=tuple(name for name in STEERING_FIELDS if name in body),
            translated=chat,
            length_fields=length_fields,
            dropped=tuple(dropped.names),
        )

    def _max_tokens(self, body: Mapping[str, Any]) -> int | None:
        value = body.get("max_tokens")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_INT:
            raise InvalidRequest("max_tokens: must be a positive integer.", param="max_tokens", code="invalid_value")
        return value

    def native(self, engine: str) -> bool:
        return engine in self._native_kinds

    def native_body(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        """The client's bytes, or the body re-encoded with the edits and the engine's fixes."""
        fixed = fix_native(inbound.body, target.fixes) if target.fixes else None
        if fixed is None:
            if not needs_encoding(edits, inbound.model, model):
                return inbound.raw
            return apply_edits(inbound.body, edits, self._length_field, model, inbound.length_fields)
        return apply_edits(fixed, edits, self._length_field, model, inbound.length_fields)

    def base_edits(self, inbound: Inbound) -> Edits:
        return Edits(drop_fields=inbound.stripped) if inbound.stripped else NO_EDITS

    def answer_id(self, data: bytes) -> str | None:
        return None  # the engines keep no Messages state: nothing to pin

    def error_status(self, err: GatewayError) -> int:
        return from_gateway_error(err)[0]

    def error_body(self, err: GatewayError) -> bytes:
        return error_body_bytes(from_gateway_error(err)[1])

    def error_event(self, message: str, code: str) -> bytes:
        return encode_event("error", error_body(502, message))


class MessagesProtocol(AnthropicProtocol):
    """POST /v1/messages: a conversation to route, cap and stream, in Anthropic's events."""

    path = "/v1/messages"
    _native_api = "messages"

    def __init__(self) -> None:
        super().__init__()
        self._chat = Target(_CHAT, native=False)

    def estimate_view(self, inbound: Inbound) -> Mapping[str, Any] | None:
        return inbound.translated

    def target(self, inbound: Inbound, engine: str) -> Target:
        return self._targets.get(engine, self._chat)

    def encode(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        if target.native:
            return self.native_body(inbound, edits, model, target)
        assert inbound.translated is not None
        return apply_edits(inbound.translated, edits, "max_tokens", model)

    def observer(self, inbound: Inbound, edits: Edits, target: Target) -> SseObserver:
        if target.native:
            return NativeObserver.messages()
        return StreamObserver(strip_usage=False, whole_events=True)

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        return None if target.native else MessagesStream(model=inbound.model)

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        if target.native:
            return raw
        message = chat_to_message(parsed if isinstance(parsed, dict) else {}, model=inbound.model)
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()

    def usage(self, parsed: Any) -> dict[str, Any] | None:
        if not isinstance(parsed, dict) or not isinstance(parsed.get("usage"), dict):
            return None
        usage: dict[str, Any] = parsed["usage"]
        if "choices" in parsed:  # translated: the engine's chat answer
            return usage
        fields = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        prompt = sum(v for k in fields if isinstance(v := usage.get(k), int) and not isinstance(v, bool))
        completion = usage.get("output_tokens")
        completion = completion if isinstance(completion, int) and not isinstance(completion, bool) else 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class CountTokensProtocol(AnthropicProtocol):
    """POST /v1/messages/count_tokens, routed by model like a request but never capped: native where
    the engine counts itself, else one chat completion of max_tokens 1 whose usage is the engine's own
    prompt count (any OpenAI-compatible engine can do that; not every one has a tokenizer endpoint)."""

    path = "/v1/messages/count_tokens"
    _native_api = "count_tokens"
    _length_field: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self._chat = Target(_CHAT, native=False)

    def _max_tokens(self, body: Mapping[str, Any]) -> int | None:
        return None  # count_tokens has no output limit

    def parse(self, raw: bytes, limits: LimitsConfig) -> Inbound:
        inbound = super().parse(raw, limits)
        if inbound.stream:
            raise InvalidRequest("stream: count_tokens does not stream.", param="stream", code="invalid_value")
        return inbound

    def estimate_view(self, inbound: Inbound) -> Mapping[str, Any] | None:
        return None  # nothing to cap; a count is not a generation

    def target(self, inbound: Inbound, engine: str) -> Target:
        return self._targets.get(engine, self._chat)

    def encode(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        if target.native:
            return self.native_body(inbound, edits, model, target)
        assert inbound.translated is not None
        chat = {**inbound.translated, "max_tokens": 1, "stream": False}
        return apply_edits(chat, NO_EDITS, None, model or inbound.model)

    def observer(self, inbound: Inbound, edits: Edits, target: Target) -> SseObserver:
        return StreamObserver(strip_usage=False)  # never used: count_tokens does not stream

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        return None

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        if target.native:
            return raw
        usage = parsed.get("usage") if isinstance(parsed, dict) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(prompt, int) or isinstance(prompt, bool):
            raise UpstreamError("The backend's answer had no prompt token count.", code="bad_upstream_response")
        return json.dumps(count_tokens_body(prompt)).encode()

    def usage(self, parsed: Any) -> dict[str, Any] | None:
        return None  # a count generates nothing for the client: no tokens to account


MESSAGES = MessagesProtocol()
COUNT_TOKENS = CountTokensProtocol()
