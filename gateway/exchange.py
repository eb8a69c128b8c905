"""One client request's state on its way through the gateway, and its finish step: exactly one
outcome, the per-request and aggregate metrics, and one access-log line."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from gateway.inbound import InboundRequest
from gateway.metrics import NONE, GatewayMetrics
from gateway.registry import Backend
from gateway.sse import StreamObserver

log = logging.getLogger("gateway.access")

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


@dataclass(slots=True, eq=False)
class Exchange:
    request_id: str
    kind: str
    metrics: GatewayMetrics
    route: str = "__unknown__"
    inbound: InboundRequest | None = None
    started: float = field(default_factory=time.perf_counter)
    upstream_model: str | None = None
    pool: str = NONE
    rule: str = ""
    backend: Backend | None = None
    backend_name: str = NONE
    outcome: str | None = None
    status: int = 0
    response_started: bool = False
    injected_usage: bool = False
    observer: StreamObserver | None = None
    usage: dict[str, Any] | None = None
    prompt_estimate: int = 0
    sent_at: float | None = None
    disconnect_stage: str | None = None
    extra_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    finished: bool = False
    estimator_key: tuple[str, str] | None = None
    prompt_chars: int = 0
    prompt_messages: int = 0
    prompt_exact: int | None = None
    streamed_tokens: int = 0
    """Output tokens already added to gateway_output_tokens_total while the stream was relayed."""
    _gauge: Gauge | None = None
    _encoded: dict[str | None, bytes] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return _PATHS[self.kind]

    def set_backend(self, backend: Backend) -> None:
        self.backend = backend
        self.backend_name = backend.name
        self._gauge = self.metrics.child(self.metrics.in_flight, self.route, self.pool, backend.name)

    def in_flight_gauge(self) -> Gauge:
        assert self._gauge is not None
        return self._gauge

    def mark_sent(self) -> None:
        self.sent_at = time.perf_counter()
        self.metrics.child(self.metrics.overhead, self.route).observe(self.sent_at - self.started)

    def upstream_body(self, raw: bytes, backend: Backend) -> bytes:
        """The client's bytes when nothing changed; otherwise the body re-encoded once per
        distinct upstream model name."""
        assert self.inbound is not None
        model = backend.model or self.upstream_model
        if not self.inbound.modified and (model is None or model == self.inbound.model):
            return raw
        cached = self._encoded.get(model)
        if cached is None:
            body = self.inbound.body if model is None else {**self.inbound.body, "model": model}
            cached = self._encoded[model] = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        return cached

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"x-request-id", self.request_id.encode()),
            (b"x-gateway-pool", self.pool.encode()),
            (b"x-gateway-backend", self.backend_name.encode()),
            (b"x-gateway-rule", self.rule.encode("latin-1", "replace")),
            *self.extra_headers,
        ]

    def engine_truncated(self, usage: dict[str, Any]) -> bool:
        """True when the engine reports far fewer prompt tokens than were sent: it cut the prompt
        silently (Ollama does). Exact counts are trusted to 10 %; the conservative estimate, to half."""
        reported = _int(usage.get("prompt_tokens"))
        if reported is None:
            return False
        if self.prompt_exact:
            return reported < 0.9 * self.prompt_exact
        return self.prompt_estimate > 256 and reported < 0.5 * self.prompt_estimate

    def count_streamed(self, content_events: int) -> None:
        """Add the content chunks relayed since the last call to the output-token counter, so that
        rate() shows a long answer's tokens as they flow, not all at its end. finish() corrects the
        total to the engine's usage figure (which may count more than one token per chunk)."""
        delta = content_events - self.streamed_tokens
        if delta > 0:
            self.metrics.child(self.metrics.output_tokens, self.route, self.pool, self.backend_name, "usage").inc(delta)
            self.streamed_tokens = content_events

    def reported_usage(self) -> dict[str, Any] | None:
        if self.usage is not None:
            return self.usage
        return self.observer.usage if self.observer is not None else None

    def finish(self) -> None:
        """Record the one outcome and every metric for this request. Called once, in finally."""
        now = time.perf_counter()
        m = self.metrics
        outcome = self.outcome or "client_closed"
        labels = (self.route, self.pool, self.backend_name)
        fine = (self.route, self.pool)  # the fine per-request histograms have no backend label
        m.child(m.requests, *labels, outcome).inc()
        duration = now - self.started
        if self.sent_at is not None:
            m.child(m.duration, *fine).observe(duration)
        obs = self.observer
        usage = self.reported_usage()
        completion = prompt = None
        source = "usage"
        if usage is not None:
            completion = _int(usage.get("completion_tokens"))
            prompt = _int(usage.get("prompt_tokens"))
        if completion is None and obs is not None:
            completion, source = obs.content_events, "estimated"
        if prompt is None and self.sent_at is not None:
            prompt = self.prompt_estimate
        if completion and completion > self.streamed_tokens:
            # Tokens already counted while the stream ran are not counted twice.
            m.child(m.output_tokens, *labels, source).inc(completion - self.streamed_tokens)
        if prompt and self.sent_at is not None:
            m.child(m.prompt_tokens, *labels, "usage" if usage is not None else "estimated").inc(prompt)
        if obs is not None and obs.first_token_at is not None:
            m.child(m.ttft, *fine).observe(obs.first_token_at - self.started)
            if obs.gaps:
                itl = m.child(m.itl, *fine)
                for gap in obs.gaps:
                    itl.observe(gap)
            decode = (obs.last_token_at or obs.first_token_at) - obs.first_token_at
            if completion and completion > 1 and decode > 0:
                # The first token belongs to prefill; decode speed counts the ones after it.
                m.child(m.request_tps, *fine).observe((completion - 1) / decode)
        if outcome == "client_closed":
            stage = self.disconnect_stage or "before_backend"
            m.child(m.client_disconnects, *labels, stage).inc()
            if completion:
                m.child(m.wasted_tokens, *labels).inc(completion)
        if log.isEnabledFor(logging.INFO):
            ttft = obs.first_token_at - self.started if obs and obs.first_token_at else None
            log.info(
                "%s %s model=%s route=%s pool=%s backend=%s rule=%s status=%d outcome=%s "
                "duration=%.4f ttft=%s out_tokens=%s",
                self.request_id,
                self.path,
                self.inbound.model if self.inbound and self.route != "__unknown__" else "-",
                self.route,
                self.pool,
                self.backend_name,
                self.rule or "-",
                self.status,
                outcome,
                duration,
                f"{ttft:.4f}" if ttft is not None else "-",
                completion if completion else 0,
            )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
