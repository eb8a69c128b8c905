"""The protocol adapters the gateway serves, by api name (a Literal plus a lookup table)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.protocols.base import Api, ProtocolAdapter
from gateway.protocols.chat import CHAT
from gateway.protocols.completions import COMPLETIONS
from gateway.protocols.embeddings import EMBEDDINGS
from gateway.protocols.responses import RESPONSES
from gateway.protocols.tokenize import DETOKENIZE, TOKENIZE

PROTOCOLS: Mapping[Api, ProtocolAdapter] = MappingProxyType(
    {p.api: p for p in (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, TOKENIZE, DETOKENIZE)}
)
