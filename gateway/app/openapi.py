"""The gateway's OpenAPI 3.1 description, served at GET /openapi.json: every endpoint, the request
fields and constraints the gateway itself checks (everything else passes through to the engine), and
the error bodies in each protocol's shape. A static document, built once when the app is created."""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

from gateway.config import LimitsConfig

Schema = dict[str, Any]

_MAX_INT = 2**31 - 1
_MAX_MODEL_CHARS = 256

OPENAI_ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ANTHROPIC_ERROR: Schema = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def _nullable(schema: Schema) -> Schema:
    kind = schema["type"]
    return {**schema, "type": [*kind, "null"] if isinstance(kind, list) else [kind, "null"]}


def _positive_int(maximum: int = _MAX_INT) -> Schema:
    return {"type": ["integer", "null"], "minimum": 1, "maximum": maximum}


_MODEL: Schema = {"type": "string", "minLength": 1, "maxLength": _MAX_MODEL_CHARS}
_NUMBER: Schema = {"type": ["number", "null"]}
_OPENAI_ERRORS = {"400", "401", "403", "404", "413", "429", "431"}


def _openai_common(limits: LimitsConfig) -> dict[str, Schema]:
    """The fields of the OpenAI-family bodies the gateway checks (gateway/protocols/inbound.py)."""
    return {
        "model": _MODEL,
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": "boolean"}}},
        "temperature": _NUMBER,
        "top_p": _NUMBER,
        "presence_penalty": _NUMBER,
        "frequency_penalty": _NUMBER,
        "n": _positive_int(limits.max_n),
        "max_tokens": _positive_int(),
        "tools": {"type": ["array", "null"], "items": {"type": "object"}},
        "user": {"type": ["string", "null"]},
    }


def _chat_request(limits: LimitsConfig) -> Schema:
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string"},
            "content": {"type": ["string", "array", "null"], "items": {"type": "object"}},
            "name": {"type": "string"},
        },
    }
    properties = _openai_common(limits)
    properties["max_completion_tokens"] = _positive_int()
    properties["messages"] = {"type": "array", "minItems": 1, "maxItems": limits.max_messages, "items": message}
    return {"type": "object", "required": ["model", "messages"], "properties": properties}


def _completions_request(limits: LimitsConfig) -> Schema:
    properties = _openai_common(limits)
    properties["best_of"] = _positive_int(limits.max_n)
    properties["prompt"] = {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": ["string", "integer", "array"]}},
        ]
    }
    return {"type": "object", "required": ["model", "prompt"], "properties": properties}


def _embeddings_request() -> Schema:
    return {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": ["string", "integer", "array"]}},
                ]
            },
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "minimum": 1},
            "stream": {"const": False},
            "user": {"type": ["string", "null"]},
        },
    }


def _anthropic_block() -> Schema:
    return {
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"type": "string", "enum": ["text", "image", "tool_use", "tool_result"]}},
    }


def _messages_request(limits: LimitsConfig, count_tokens: bool) -> Schema:
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _anthropic_block()}]},
        },
    }
    properties: dict[str, Schema] = {
        "model": _MODEL,
        "messages": {"type": "array", "minItems": 1, "maxItems": limits.max_messages, "items": message},
        "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": _anthropic_block()}]},
        "tools": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "tool_choice": {"type": "object", "required": ["type"]},
    }
    required = ["model", "messages"]
    if not count_tokens:
        properties |= {
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": _MAX_INT},
            "stream": {"type": ["boolean", "null"]},
            "stop_sequences": {"type": "array", "items": {"type": "string"}},
            "temperature": {"type": "number"},
            "top_p": {"type": "number"},
            "top_k": {"type": "integer"},
            "metadata": {"type": "object"},
        }
        required.append("max_tokens")
    return {"type": "object", "required": required, "properties": properties}


def _responses_request(limits: LimitsConfig) -> Schema:
    item = {"type": "object", "properties": {"type": {"type": "string"}, "role": {"type": "string"}}}
    return {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "maxItems": limits.max_messages, "items": item},
                ]
            },
            "instructions": {"type": ["string", "null"]},
            "stream": {"type": ["boolean", "null"]},
            "max_output_tokens": _positive_int(),
            "temperature": _NUMBER,
            "top_p": _NUMBER,
            "tools": {"type": ["array", "null"], "items": {"type": "object"}},
            "store": {"type": ["boolean", "null"]},
            "previous_response_id": {"type": ["string", "null"]},
            "user": {"type": ["string", "null"]},
        },
    }


def _tokenize_request() -> Schema:
    return {
        "type": "object",
        "required": ["model"],
        "properties": {
            "model": _MODEL,
            "prompt": {"type": "string"},
            "messages": {"type": "array", "items": {"type": "object"}},
            "add_special_tokens": {"type": "boolean"},
        },
        "oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}],
    }


def _detokenize_request() -> Schema:
    return {
        "type": "object",
        "required": ["model", "tokens"],
        "properties": {"model": _MODEL, "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
    }


def _errors(shape: str, codes: set[str]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{shape}"}
    described = {
        "400": "Bad request: invalid JSON, a field of the wrong type, a context over the cap",
        "401": "Missing or unknown client key",
        "403": "The client key may not use this model",
        "404": "Unknown model, route or stored response",
        "413": "Body too large",
        "429": "Rate limit or the gateway's queue is full (Retry-After)",
        "431": "Request headers too large",
        "502": "The engine failed or sent an invalid answer",
        "503": "No healthy backend, or the gateway is draining",
        "504": "The engine did not answer in time",
    }
    return {
        code: {"description": described[code], "content": {"application/json": {"schema": ref}}}
        for code in sorted(codes | {"502", "503", "504"})
    }


def _json_body(schema: Schema) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _post(
    summary: str, schema: Schema, streams: bool, shape: str = "OpenAIError", tag: str = "openai"
) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        # One server-sent event (its data and event name); the stream is a sequence of them.
        event = {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
        ok["text/event-stream"] = {"schema": event}
    return {
        "post": {
            "summary": summary,
            "tags": [tag],
            "requestBody": _json_body(schema),
            "responses": {
                "200": {"description": "The engine's answer", "content": ok},
                **_errors(shape, _OPENAI_ERRORS),
            },
        }
    }


def _get(summary: str, ok: Schema, media: str = "application/json") -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK", "content": {media: {"schema": ok}}}}
    return {"get": {"summary": summary, "tags": ["gateway"], "responses": responses}}


def _id_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def _models_list() -> Schema:
    model = {
        "type": "object",
        "required": ["id", "object"],
        "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "owned_by": {"type": "string"}},
    }
    return {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": model}},
    }


def _stored_response(method: str, summary: str) -> dict[str, Any]:
    errors = _errors("OpenAIError", {"401", "404"})
    return {
        method: {
            "summary": summary,
            "tags": ["openai"],
            "parameters": [_id_param("response_id")],
            "responses": {"200": {"description": "The stored response", "content": _json_object()}, **errors},
        }
    }


def _json_object() -> dict[str, Any]:
    return {"application/json": {"schema": {"type": "object"}}}


def _version() -> str:
    try:
        return importlib.metadata.version("llm-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def openapi_document(limits: LimitsConfig | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 description; ``limits`` sets maxima the gateway enforces (max_n, max_messages)."""
    limits = limits or LimitsConfig()
    unavailable = {"503": {"description": "Not ready", "content": _json_object()}}
    health = _get("Liveness: the process answers", {"type": "object", "required": ["status"]})
    readiness = _get("Readiness: a healthy backend and not draining", {"type": "object", "required": ["ready"]})
    readiness["get"]["responses"] |= unavailable
    models = _get("The configured models (exact route names the key may use)", _models_list())
    models["get"]["responses"] |= _errors("OpenAIError", {"401"})
    one_model = {
        "get": {
            "summary": "One model by name",
            "tags": ["openai"],
            "parameters": [_id_param("model")],
            "responses": {
                "200": {"description": "The model", "content": _json_object()},
                **_errors("OpenAIError", {"401", "404"}),
            },
        }
    }
    paths: dict[str, Any] = {
        "/v1/chat/completions": _post("OpenAI chat completions", _chat_request(limits), streams=True),
        "/v1/completions": _post("OpenAI text completions", _completions_request(limits), streams=True),
        "/v1/embeddings": _post("OpenAI embeddings", _embeddings_request(), streams=False),
        "/v1/responses": _post("OpenAI Responses", _responses_request(limits), streams=True),
        "/v1/responses/{response_id}": _stored_response("get", "A stored response"),
        "/v1/responses/{response_id}/cancel": _stored_response("post", "Cancel a background response"),
        "/v1/messages": _post(
            "Anthropic Messages", _messages_request(limits, False), True, "AnthropicError", "anthropic"
        ),
        "/v1/messages/count_tokens": _post(
            "Anthropic token count", _messages_request(limits, True), False, "AnthropicError", "anthropic"
        ),
        "/tokenize": _post("Token ids of a prompt (vLLM's shape)", _tokenize_request(), streams=False),
        "/detokenize": _post("Text of token ids (vLLM's shape)", _detokenize_request(), streams=False),
        "/v1/models": models,
        "/v1/models/{model}": one_model,
        "/healthz": health,
        "/health": health,
        "/readyz": readiness,
        "/metrics": _get("Prometheus metrics", {"type": "string"}, "text/plain"),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "LLM inference gateway",
            "version": _version(),
            "description": (
                "One endpoint for OpenAI chat/completions/embeddings/Responses and Anthropic Messages in "
                "front of vLLM, SGLang, llama.cpp and other engines. The request schemas list what the "
                "gateway itself checks; other fields pass through to the engine."
            ),
        },
        "paths": paths,
        "components": {"schemas": {"OpenAIError": OPENAI_ERROR, "AnthropicError": ANTHROPIC_ERROR}},
    }


def openapi_bytes(limits: LimitsConfig | None = None) -> bytes:
    return json.dumps(openapi_document(limits), separators=(",", ":")).encode()
