"""The protocol-adapter seam: what the serving pipeline needs from a client protocol. One adapter
per protocol (chat, completions, embeddings; messages and responses later); the pipeline holds one
and has no branch on which it is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from gateway.config import LimitsConfig
from gateway.errors import GatewayError
from gateway.protocols.edits import Edits
from gateway.value import value

Api = Literal["chat", "completions", "embeddings", "messages", "responses", "tokenize", "detokenize"]
"""The client protocols, by name; each has one adapter (gateway/protocols/catalog.py)."""


@value
class Inbound:
    """A client's request, parsed once and never changed: edits are a separate value (Edits)."""

    api: Api
    raw: bytes
    """The client's bytes, sent upstream as they are when there are no edits."""
    body: Mapping[str, Any]
    """The decoded body. Read-only by contract: edits never write into it."""
    model: str
    stream: bool
    include_usage: bool
    """The client itself asked for the usage at the end of a stream."""
    max_tokens: int | None
    max_tokens_field: str | None
    """Which field holds the output limit in this protocol; None when it has none (embeddings)."""
    n: int
    messages: Sequence[Mapping[str, Any]] | None
    """The conversation, when the protocol has one (truncate_oldest drops from it)."""
    has_tools: bool
    user: str | None
    stripped: tuple[str, ...] = ()
    """Fields the client may not set (they could steer the upstream URL or key): always dropped."""
    translated: Mapping[str, Any] | None = None
    """A translating protocol's chat-shaped body, computed once in parse, for its estimate_view and
    encode (None for the OpenAI protocols, whose body is already chat-shaped)."""
    length_fields: tuple[str, ...] = ()
    """Every output-length field the client set (engines' own too: `n_predict`, ...); a max_tokens
    edit writes them all, so none can carry more than the cap allows."""
    dropped: tuple[str, ...] = ()
    """What the translation to chat completions leaves out (thinking, web_search, ...): said in the
    x-gateway-dropped header and counted when a request takes the translated path."""
    pin: str | None = None
    """An id of state that one backend holds (Responses' previous_response_id): the request must go
    to the backend that answered with that id, not to the balancer's choice."""


@value
class Target:
    """Where one attempt goes on one engine, and whether the bytes pass through untouched."""

    path: str
    native: bool = True
    """The engine speaks this protocol itself: bodies and streams are relayed as they are."""
    fixes: frozenset[str] = frozenset()
    """Rewrites a native body needs on this engine (its table's native_fixes)."""


class SseObserver(Protocol):
    """Watches an upstream event stream chunk by chunk and returns the bytes to relay."""

    done: bool
    error: dict[str, Any] | None
    usage: dict[str, Any] | None
    content_events: int
    first_token_at: float | None
    last_token_at: float | None
    gaps: list[float]
    together: int  # content events that came in the same read as the one before them: 0 s apart

    def feed(self, chunk: bytes, now: float) -> bytes:
        """Raises EventTooLarge (protocols/events.py) for an event past the limit."""
        ...

    def flush(self) -> bytes: ...

    def limit_events(self, max_bytes: int) -> None:
        """The longest event the upstream may send (limits.max_event_bytes)."""
        ...


class StreamTransform(Protocol):
    """Rewrites a translated stream: fed the bytes the observer passed on (whole events when the
    observer was made with whole_events=True), it returns the client's bytes; finish() ends it once
    the upstream sent its final event (a cut stream gets the adapter's error_event instead).
    MessagesStream and ResponsesStream (protocols/*_stream.py) have this shape."""

    def feed(self, chunk: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class ProtocolAdapter(Protocol):
    """One client protocol. Hot-path methods must stay cheap: no per-chunk work beyond the observer,
    and the body is decoded once (parse) and encoded at most once per upstream model (encode)."""

    api: Api
    path: str
    """The gateway's own path for it, e.g. /v1/chat/completions."""

    def parse(self, raw: bytes, limits: LimitsConfig) -> Inbound:
        """Decode and validate the body; InvalidRequest (400, naming the field) on bad input."""
        ...

    def estimate_view(self, inbound: Inbound) -> Mapping[str, Any] | None:
        """The prompt as an OpenAI-chat-shaped mapping (messages or prompt, tools) that the token
        estimate, the exact count and the prefix fingerprint read; None when there is no prompt to
        cap or route by (embeddings). For OpenAI protocols it is the body itself, not a copy."""
        ...

    def base_edits(self, inbound: Inbound) -> Edits:
        """The edits every request of this protocol gets before any cap: dropping steering fields,
        and asking a stream for its usage when the client did not (the observer strips it again)."""
        ...

    def target(self, inbound: Inbound, engine: str) -> Target:
        """The upstream path on an engine of kind `engine`, and whether that is a pass-through."""
        ...

    def encode(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        """The upstream body: inbound.raw when there is nothing to change, else encoded once."""
        ...

    def observer(self, inbound: Inbound, edits: Edits, target: Target) -> SseObserver:
        """A fresh stream observer for one attempt (first token, gaps, usage, [DONE]). A translating
        protocol that needs the usage event itself asks for StreamObserver(strip_usage=False,
        whole_events=True) and drops it in its transform; a native one returns its own observer."""
        ...

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        """None for a native target (the relay passes bytes through); else the translator."""
        ...

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        """A non-stream answer for the client: `raw` itself for a native target."""
        ...

    def answer_id(self, data: bytes) -> str | None:
        """The id of state the backend stored for this answer (a Responses id), found in a body or
        a stream's first chunk, so that later requests naming it reach that backend; None when the
        protocol stores nothing (called once per answer, so it must be cheap)."""
        ...

    def usage(self, parsed: Any) -> dict[str, Any] | None:
        """The usage object of a decoded non-stream answer (OpenAI field names), if any."""
        ...

    def error_status(self, err: GatewayError) -> int:
        """The HTTP status of an error in this protocol (Anthropic's overload is 529, not 429)."""
        ...

    def error_body(self, err: GatewayError) -> bytes:
        """An error as a JSON body in this protocol's shape."""
        ...

    def error_event(self, message: str, code: str) -> bytes:
        """The one event that ends a stream cut short (no [DONE] after it)."""
        ...
