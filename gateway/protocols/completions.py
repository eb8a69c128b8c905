"""OpenAI legacy completions (/v1/completions): one prompt string (or token arrays)."""

from __future__ import annotations

from gateway.protocols.openai import OpenAIProtocol

COMPLETIONS = OpenAIProtocol("completions", "/v1/completions")
