"""One client request's record on its way through the gateway: typed fields that the pipeline's
steps fill in, read once at the end by accounting. It computes nothing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.fleet.registry import Backend
from gateway.metrics import NONE
from gateway.metrics import Outcome as Outcome
from gateway.protocols.base import Api, SseObserver
from gateway.tracing.base import RequestSpan

"""Exactly one per request (gateway_requests_total's outcome); internal_error is a gateway bug."""

DisconnectStage = Literal["before_backend", "waiting_first_byte", "mid_stream", "non_stream"]


@dataclass(slots=True, eq=False)
class Exchange:
    request_id: str
    api: Api
    path: str
    started: float = field(default_factory=time.perf_counter)
    """When the request arrived: its first byte, where the server stamped it, else the handler's start.
    TTFT and the duration run from here, as the client's clock does."""
    entered: float = field(default_factory=time.perf_counter)
    """When the handler began; the gateway's own overhead (to the upstream send) runs from here, so a
    slow upload or a wait behind a pipelined request is not counted as the gateway's work."""
    route: str = "__unknown__"
    model: str | None = None
    """The client's model name, for the access log (never a metric label)."""
    stream: bool = False
    query: str = ""
    """The client's query string (Claude Code's ?beta=true): sent on where the engine serves the
    protocol natively; a translated request's path is the gateway's own."""
    served_model: str | None = None
    """The name the backend was sent, where it is not the client's: the answer's is rewritten back."""
    pool: str = NONE
    rule: str = ""
    backend: Backend | None = None
    backend_name: str = NONE
    outcome: Outcome | None = None
    status: int = 0
    response_started: bool = False
    sent_at: float | None = None
    disconnect_stage: DisconnectStage | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    """Response headers the steps added (cap actions, engine truncation)."""
    observer: SseObserver | None = None
    usage: dict[str, Any] | None = None
    estimator_key: tuple[str, str] | None = None
    prompt_chars: int = 0
    prompt_messages: int = 0
    prompt_estimate: int = 0
    prompt_exact: int | None = None
    client_stalled: bool = False
    """The idle limit passed while the backend's bytes waited unread: the client stopped reading."""
    answer_id: str | None = None
    """The id of state the backend stored for this answer (a Responses id), recorded at the end."""
    scope: dict[str, Any] | None = None
    """The request's scope where the gateway's own server runs it: the relay finds the stream's
    ChunkWriter there (asgi.BODY_WRITER) once the head is out."""
    streamed_tokens: int = 0
    """Output tokens already added to gateway_output_tokens_total while the stream was relayed."""
    trace: RequestSpan | None = None
    """The request's server span where tracing is on (pipeline/spans.py fills it in)."""
    predicted_cached: int | None = None
    """kv_events: the prompt tokens the attempt's backend held by its KV events when the request was
    routed, to set beside the cached_tokens its answer reports; None: no prediction."""

    def reported_usage(self) -> dict[str, Any] | None:
        """The engine's usage: from the body, else from the stream's usage event."""
        if self.usage is not None:
            return self.usage
        return self.observer.usage if self.observer is not None else None
