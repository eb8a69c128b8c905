"""OpenAI chat completions (/v1/chat/completions): messages in, a conversation to cap and route by."""

from __future__ import annotations

from gateway.protocols.openai import OpenAIProtocol

CHAT = OpenAIProtocol("chat", "/v1/chat/completions")
