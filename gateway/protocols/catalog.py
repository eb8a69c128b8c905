"""The protocol adapters the gateway serves, by api name (a Literal plus a lookup table), and every
endpoint the pipeline serves (a protocol may have more than one: Messages and its count_tokens)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.protocols.base import Api, ProtocolAdapter
from gateway.protocols.chat import CHAT, CHAT_REASONING
from gateway.protocols.completions import COMPLETIONS
from gateway.protocols.embeddings import EMBEDDINGS
from gateway.protocols.messages import COUNT_TOKENS, MESSAGES
from gateway.protocols.responses import RESPONSES
from gateway.protocols.tokenize import DETOKENIZE, TOKENIZE

PROTOCOLS: Mapping[Api, ProtocolAdapter] = MappingProxyType(
    {p.api: p for p in (CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, RESPONSES, TOKENIZE, DETOKENIZE)}
)
ENDPOINTS: tuple[ProtocolAdapter, ...] = (*PROTOCOLS.values(), COUNT_TOKENS)
"""Every path the pipeline serves, one adapter each."""
REASONING_COPY: Mapping[Api, ProtocolAdapter] = MappingProxyType({"chat": CHAT_REASONING})
"""The adapter a route with `reasoning_content: copy` gets instead, by api (chat only)."""
