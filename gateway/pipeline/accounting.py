"""The side effects of a request's record: its metrics (both lenses: the request's own speed and the
machine's throughput) and its one access-log line. Called as the request goes, and once at its end."""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway import accesslog
from gateway.fleet.registry import Backend
from gateway.metric_types import PlainValue, observe_many
from gateway.metrics import GatewayMetrics
from gateway.pipeline.exchange import Exchange

log = logging.getLogger("gateway.access")


class Accounting:
    __slots__ = ("_m",)

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def in_flight(self, ex: Exchange, backend: Backend) -> PlainValue:
        """The in-flight gauge's sample for the request's attempt on `backend` (inc(1), inc(-1))."""
        return self._m.series(ex.route, ex.pool, backend.name, ex.api).in_flight()

    def sent(self, ex: Exchange) -> None:
        """The first attempt leaves: the gateway's own overhead ends here."""
        ex.sent_at = time.perf_counter()
        trace = ex.trace
        exemplar = {"trace_id": trace.trace_id} if trace is not None and trace.trace_id else None
        self._m.child(self._m.overhead, ex.route).observe(ex.sent_at - ex.entered, exemplar)

    def count_streamed(self, ex: Exchange, content_events: int) -> None:
        """Add the content chunks relayed since the last call to the output-token counter, so that
        rate() shows a long answer's tokens as they flow, not all at its end. finish() corrects the
        total to the engine's usage figure (which may count more than one token per chunk)."""
        delta = content_events - ex.streamed_tokens
        if delta > 0:
            self._m.series(ex.route, ex.pool, ex.backend_name, ex.api).tokens("output", "usage").inc(delta)
            ex.streamed_tokens = content_events

    def finish(self, ex: Exchange) -> None:
        """Record the one outcome and every metric for this request. Called once, at its end."""
        now = time.perf_counter()
        m = self._m
        outcome = ex.outcome or "client_closed"
        series = m.series(ex.route, ex.pool, ex.backend_name, ex.api)
        series.outcome(outcome).inc(1)
        duration = now - ex.started
        trace = ex.trace
        # The trace id as the latency samples' exemplar (shown where the scrape asks for OpenMetrics).
        exemplar = {"trace_id": trace.trace_id} if trace is not None and trace.trace_id else None
        if ex.sent_at is not None:
            series.fine(m.duration).observe(duration, exemplar)
        obs = ex.observer
        usage = ex.reported_usage()
        completion = prompt = None
        source = "usage"
        if usage is not None:
            completion = _int(usage.get("completion_tokens"))
            prompt = _int(usage.get("prompt_tokens"))
        if completion is None and obs is not None:
            completion, source = obs.content_events, "estimated"
        if prompt is None and ex.sent_at is not None:
            prompt = ex.prompt_estimate
        if completion and completion > ex.streamed_tokens:
            # Tokens already counted while the stream ran are not counted twice.
            series.tokens("output", source).inc(completion - ex.streamed_tokens)
        if prompt and ex.sent_at is not None:
            series.tokens("prompt", "usage" if usage is not None else "estimated").inc(prompt)
        if ex.predicted_cached is not None and usage is not None:
            self._prediction(ex, ex.predicted_cached, usage)
        if obs is not None and obs.first_token_at is not None:
            series.fine(m.ttft).observe(obs.first_token_at - ex.started, exemplar)
            if obs.gaps or obs.together:
                observe_many(series.fine(m.itl), obs.gaps, zeros=obs.together)
            decode = (obs.last_token_at or obs.first_token_at) - obs.first_token_at
            if completion and completion > 1 and decode > 0:
                # The first token belongs to prefill; decode speed counts the ones after it.
                series.fine(m.request_tps).observe((completion - 1) / decode)
        if outcome == "client_closed":
            stage = ex.disconnect_stage or "before_backend"
            labels = (ex.route, ex.pool, ex.backend_name)
            m.child(m.client_disconnects, *labels, ex.api, stage).inc()
            if completion:
                m.child(m.wasted_tokens, *labels).inc(completion)
        if log.isEnabledFor(logging.INFO):
            ttft = f"{obs.first_token_at - ex.started:.4f}" if obs and obs.first_token_at else "-"
            model = ex.model if ex.model is not None and ex.route != "__unknown__" else "-"
            accesslog.write(
                log,
                f"{ex.request_id} {ex.path} model={model} route={ex.route} pool={ex.pool} "
                f"backend={ex.backend_name} rule={ex.rule or '-'} status={ex.status} outcome={outcome} "
                f"duration={duration:.4f} ttft={ttft} out_tokens={completion or 0}",
            )

    def _prediction(self, ex: Exchange, predicted: int, usage: dict[str, Any]) -> None:
        """The KV-event index's prediction against the prefix-cache hit the engine reports (its
        usage's prompt_tokens_details.cached_tokens; vLLM gives it with --enable-prompt-tokens-details).
        An answer without that figure is not compared."""
        details = usage.get("prompt_tokens_details")
        served = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        if served is None:
            return
        m = self._m
        m.child(m.kv_predicted_tokens, ex.pool, ex.backend_name).inc(predicted)
        m.child(m.kv_served_tokens, ex.pool, ex.backend_name).inc(served)
        verdict = "exact" if served == predicted else "over" if predicted > served else "under"
        m.child(m.kv_predictions, ex.pool, ex.backend_name, verdict).inc()


def prompt_tokens(usage: dict[str, Any] | None) -> int | None:
    """The engine's prompt-token count from a usage object, when it is a sane integer."""
    return _int(usage.get("prompt_tokens")) if usage is not None else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
