"""POST /tokenize and POST /detokenize in vLLM's shapes, routed by model: native on engines whose table
lists "tokenize" (vLLM; SGLang, whose detokenize answer is renamed), translated for llama.cpp (text
only: {"content"} in, {"tokens"} out), a 400 on engines without a tokenizer endpoint."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from engines.adapters import adapter_for
from gateway.config import LimitsConfig
from gateway.errors import InvalidRequest
from gateway.protocols.base import Api, Inbound, SseObserver, StreamTransform, Target
from gateway.protocols.edits import NO_EDITS, Edits
from gateway.protocols.inbound import STEERING_FIELDS, check_model, decode_json
from gateway.protocols.openai_errors import OpenAIErrors
from gateway.protocols.sse import StreamObserver

Which = Literal["tokenize", "detokenize"]
# Engines whose /tokenize takes text only ({"content"}) and /detokenize answers {"content"}: llama.cpp.
_CONTENT_ONLY = frozenset({"llamacpp"})


class TokenizeProtocol(OpenAIErrors):
    """The ProtocolAdapter of /tokenize or /detokenize: never streamed, nothing to cap or route by."""

    __slots__ = ("_native", "_translated", "api", "path")

    def __init__(self, which: Which) -> None:
        self.api: Api = which
        self.path = "/" + which
        self._native = Target(self.path)
        self._translated = Target(self.path, native=False)

    def parse(self, raw: bytes, limits: LimitsConfig) -> Inbound:
        body = decode_json(raw, limits.max_json_depth, limits.max_json_nodes, limits.max_json_containers)
        model = check_model(body)
        if body.get("stream"):
            raise InvalidRequest(f"{self.path} cannot be streamed.", param="stream", code="invalid_value")
        if self.api == "detokenize":
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
                raise InvalidRequest("'tokens' must be an array of token ids.", param="tokens", code="invalid_type")
        else:
            has_prompt, has_messages = isinstance(body.get("prompt"), str), isinstance(body.get("messages"), list)
            if has_prompt == has_messages:
                raise InvalidRequest(
                    "Send either 'prompt' (a string) or 'messages' (an array).", param="prompt", code="invalid_type"
                )
        return Inbound(
            api=self.api,
            raw=raw,
            body=body,
            model=model,
            stream=False,
            include_usage=False,
            max_tokens=None,
            max_tokens_field=None,
            n=1,
            messages=None,
            has_tools=False,
            user=None,
            stripped=tuple(name for name in STEERING_FIELDS if name in body),
        )

    def estimate_view(self, inbound: Inbound) -> Mapping[str, Any] | None:
        return None

    def base_edits(self, inbound: Inbound) -> Edits:
        return Edits(drop_fields=inbound.stripped) if inbound.stripped else NO_EDITS

    def target(self, inbound: Inbound, engine: str) -> Target:
        if "tokenize" in adapter_for(engine).native_apis:
            return self._native if self.api == "tokenize" else self._translated  # SGLang says "text"
        if engine in _CONTENT_ONLY:
            if self.api == "tokenize" and "prompt" not in inbound.body:
                raise InvalidRequest(
                    "This model's backends (llama.cpp) tokenize text only: send 'prompt', not 'messages'.",
                    param="messages",
                    code="invalid_value",
                )
            return self._translated
        raise InvalidRequest(
            f"The backends of model '{inbound.model}' ({engine}) have no {self.path} endpoint.",
            param="model",
            code="tokenize_not_supported",
        )

    def encode(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        body = {k: v for k, v in inbound.body.items() if k not in edits.drop_fields}
        body["model"] = model or inbound.model
        if not target.native and self.api == "tokenize" and "prompt" in body:
            # llama.cpp: add_special as vLLM's default add_special_tokens=True does
            body = {"content": body["prompt"], "add_special": body.get("add_special_tokens", True)}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    def observer(self, inbound: Inbound, edits: Edits, target: Target) -> SseObserver:
        return StreamObserver(strip_usage=False)  # never used: these endpoints do not stream

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        return None

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        if target.native or not isinstance(parsed, dict):
            return raw
        if self.api == "detokenize":
            if "prompt" in parsed:
                return raw
            text = parsed.get("text", parsed.get("content"))
            return json.dumps({"prompt": text if isinstance(text, str) else ""}, ensure_ascii=False).encode()
        found = parsed.get("tokens")
        tokens: list[Any] = found if isinstance(found, list) else []
        out = {"count": len(tokens), "max_model_len": parsed.get("max_model_len"), "tokens": tokens, "token_strs": None}
        return json.dumps(out).encode()

    def answer_id(self, data: bytes) -> str | None:
        return None

    def usage(self, parsed: Any) -> dict[str, Any] | None:
        return None


TOKENIZE = TokenizeProtocol("tokenize")
DETOKENIZE = TokenizeProtocol("detokenize")
