"""What the three OpenAI protocols share: every engine speaks them natively, so bodies and streams
pass through; edits re-encode the body once; errors have OpenAI's shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mypy_extensions import mypyc_attr

from gateway.config import LimitsConfig
from gateway.protocols.base import Api, Inbound, SseObserver, StreamTransform, Target
from gateway.protocols.edits import NO_EDITS, Edits, apply_edits, needs_encoding
from gateway.protocols.inbound import Kind, parse_request
from gateway.protocols.openai_errors import OpenAIErrors
from gateway.protocols.sse import StreamObserver


@mypyc_attr(allow_interpreted_subclasses=True)  # a base for adapters of your own
class OpenAIProtocol(OpenAIErrors):
    """A ProtocolAdapter for one of chat, completions, embeddings (they differ in parsing only)."""

    __slots__ = ("_kind", "_target", "api", "path")

    def __init__(self, kind: Kind, path: str) -> None:
        self._kind: Kind = kind
        self.api: Api = kind
        self.path = path
        self._target = Target(path)

    def parse(self, raw: bytes, limits: LimitsConfig) -> Inbound:
        return parse_request(
            self._kind,
            raw,
            max_depth=limits.max_json_depth,
            max_n=limits.max_n,
            max_messages=limits.max_messages,
            max_nodes=limits.max_json_nodes,
            max_containers=limits.max_json_containers,
        )

    def estimate_view(self, inbound: Inbound) -> Mapping[str, Any] | None:
        return None if inbound.max_tokens_field is None else inbound.body

    def base_edits(self, inbound: Inbound) -> Edits:
        usage = inbound.stream and not inbound.include_usage
        if not usage and not inbound.stripped:
            return NO_EDITS
        return Edits(include_usage=usage, drop_fields=inbound.stripped)

    def target(self, inbound: Inbound, engine: str) -> Target:
        return self._target

    def encode(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        if not needs_encoding(edits, inbound.model, model):
            return inbound.raw
        return apply_edits(inbound.body, edits, inbound.max_tokens_field, model, inbound.length_fields)

    def observer(self, inbound: Inbound, edits: Edits, target: Target) -> SseObserver:
        return StreamObserver(
            strip_usage=edits.include_usage, text=self._kind == "completions", tools=inbound.has_tools
        )

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        return None

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        return raw

    def answer_id(self, data: bytes) -> str | None:
        return None

    def usage(self, parsed: Any) -> dict[str, Any] | None:
        if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
            usage: dict[str, Any] = parsed["usage"]
            return usage
        return None
