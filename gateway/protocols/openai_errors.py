"""The error defaults every OpenAI-shaped protocol shares (chat, completions, embeddings, Responses,
tokenize): the gateway's own status, its OpenAI error body, and the chat stream's error event.
Anthropic's shape is anthropic_errors.py's."""

from __future__ import annotations

import json

from mypy_extensions import mypyc_attr

from gateway.errors import GatewayError


@mypyc_attr(allow_interpreted_subclasses=True)  # a base for adapters of your own
class OpenAIErrors:
    """A ProtocolAdapter's three error methods in OpenAI's shape; a protocol overrides what differs."""

    __slots__ = ()

    def error_status(self, err: GatewayError) -> int:
        return err.status_code

    def error_body(self, err: GatewayError) -> bytes:
        return err.body_bytes()

    def error_event(self, message: str, code: str) -> bytes:
        """The one event that ends a stream cut short (no [DONE] after it)."""
        event = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
        return b"data: " + json.dumps(event).encode() + b"\n\n"
