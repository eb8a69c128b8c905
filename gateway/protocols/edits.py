"""The changes the gateway makes to a client's body, as a value: caps and the protocol return Edits,
and one function applies them and encodes the body once. With no edits the client's own bytes go
upstream; nothing edits the parsed body in place, so there is no dirty bit to forget."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.value import value


@value
class Edits:
    max_tokens: int | None = None
    """Set the protocol's output-limit field to this (a cap's default or clamp)."""
    messages: Sequence[Mapping[str, Any]] | None = None
    """The conversation after truncate_oldest dropped `dropped_messages` old messages."""
    dropped_messages: int = 0
    include_usage: bool = False
    """Ask the stream for its usage event (the client did not; the relay strips it again)."""
    drop_fields: tuple[str, ...] = ()
    headers: tuple[tuple[bytes, bytes], ...] = ()
    """Response headers that tell the client what was changed."""

    @property
    def changes_body(self) -> bool:
        return self.max_tokens is not None or self.messages is not None or self.include_usage or bool(self.drop_fields)

    def then(self, later: Edits) -> Edits:
        """These edits followed by `later`'s: its values win where it sets one; headers add up."""
        if later is NO_EDITS:
            return self
        if self is NO_EDITS:
            return later
        return Edits(
            max_tokens=later.max_tokens if later.max_tokens is not None else self.max_tokens,
            messages=later.messages if later.messages is not None else self.messages,
            dropped_messages=self.dropped_messages + later.dropped_messages,
            include_usage=self.include_usage or later.include_usage,
            drop_fields=self.drop_fields + later.drop_fields,
            headers=self.headers + later.headers,
        )


NO_EDITS = Edits()


def needs_encoding(edits: Edits, client_model: str, model: str | None) -> bool:
    """Whether the upstream body differs from the client's bytes."""
    return edits.changes_body or (model is not None and model != client_model)


def apply_edits(
    body: Mapping[str, Any],
    edits: Edits,
    max_tokens_field: str | None,
    model: str | None,
    length_fields: Sequence[str] = (),
) -> bytes:
    """A new body (the parsed one is never touched) with the edits applied, encoded once. A
    max_tokens edit goes into `max_tokens_field` and every other length field the client set."""
    out = dict(body)
    for name in edits.drop_fields:
        out.pop(name, None)
    if edits.messages is not None:
        out["messages"] = [dict(m) for m in edits.messages]
    if edits.max_tokens is not None and max_tokens_field is not None:
        out[max_tokens_field] = edits.max_tokens
        for name in length_fields:
            out[name] = edits.max_tokens
    if edits.include_usage:
        out["stream_options"] = {**(out.get("stream_options") or {}), "include_usage": True}
    if model is not None:
        out["model"] = model
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()
