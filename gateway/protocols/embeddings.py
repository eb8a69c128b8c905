"""OpenAI embeddings (/v1/embeddings): never streamed, no output limit, no prompt to cap or route by."""

from __future__ import annotations

from gateway.protocols.openai import OpenAIProtocol

EMBEDDINGS = OpenAIProtocol("embeddings", "/v1/embeddings")
