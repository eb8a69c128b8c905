"""Errors in Anthropic's shape, ``{"type":"error","error":{"type","message"}}``, from a status and a
message, from a GatewayError, or from an engine's own error body (which may be OpenAI-shaped). Pure."""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.errors import GatewayError, NoHealthyBackend, Overloaded

# Anthropic's documented error types and the status each comes with.
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
OVERLOADED_STATUS = 529


def error_type(status: int) -> str:
    """Anthropic's type for a status: the documented ones, other 4xx as invalid requests, 5xx as
    api_error (503 too: Anthropic says "overloaded" with 529, which the gateway sends for its own
    overload only)."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def from_gateway_error(exc: GatewayError) -> tuple[int, dict[str, Any]]:
    """Status and body for one of the gateway's errors. The gateway's own overload (no capacity,
    whatever its OpenAI status) is Anthropic's 529 overloaded_error, which the SDKs retry."""
    if isinstance(exc, Overloaded):
        return OVERLOADED_STATUS, {"type": "error", "error": {"type": "overloaded_error", "message": exc.message}}
    status = exc.status_code
    if isinstance(exc, NoHealthyBackend):
        return status, {"type": "error", "error": {"type": "api_error", "message": exc.message}}
    if exc.code == "context_length_exceeded":
        return status, error_body(status, context_message(exc.message))
    return status, error_body(status, exc.message)


_MAXIMUM = re.compile(r"maximum context length is (\d+) tokens")
_PARTS = re.compile(r"\((\d+) in the messages, (\d+) in the completion\)")
_PROMPT_ONLY = re.compile(r"messages resulted in (\d+) tokens")


def context_message(message: str) -> str:
    """A context error in Anthropic's own words, which Anthropic clients match on ("prompt is too
    long: P tokens > N maximum", or "input length and `max_tokens` exceed context limit: P + C > N"),
    followed by the OpenAI-worded message with its counts. Unchanged when the counts are unknown."""
    maximum = _MAXIMUM.search(message)
    if maximum is None:
        return message
    window = int(maximum.group(1))
    parts = _PARTS.search(message)
    if parts is not None:
        prompt, completion = int(parts.group(1)), int(parts.group(2))
    else:
        alone = _PROMPT_ONLY.search(message)
        if alone is None:
            return message
        prompt, completion = int(alone.group(1)), 0
    if prompt > window or completion == 0:
        head = f"prompt is too long: {prompt} tokens > {window} maximum"
    else:
        head = (
            f"input length and `max_tokens` exceed context limit: {prompt} + {completion} > {window}, "
            "decrease input length or `max_tokens` and try again"
        )
    return f"{head}. {message}"


def from_engine_error(status: int, raw: bytes) -> dict[str, Any]:
    """An engine's error body, whatever its shape, as Anthropic's: the type from the status (vLLM
    says "BadRequestError", llama.cpp answers OpenAI-shaped), the message kept."""
    message = _engine_message(raw)
    return error_body(status, context_message(message) if message else f"The backend answered with status {status}.")


def _engine_message(raw: bytes) -> str | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    inner = value.get("error")
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return str(inner["message"])
    if isinstance(inner, str):
        return inner
    for key in ("message", "detail"):
        if isinstance(value.get(key), str):
            return str(value[key])
    return None


def error_body_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
