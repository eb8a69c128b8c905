"""Try a request's backends in order until one answers: retry only before the first byte reaches
the client, within retry.max_attempts and the retry budget; report each result to passive health
(an error is judged by the engine adapter's reading of it, never by its raw status); teach the
balancer from the backend that answered; then hand over to the relay."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from gateway.errors import (
    EngineError,
    GatewayError,
    NoHealthyBackend,
    UpstreamError,
    UpstreamTimeout,
    parse_retry_after,
)
from gateway.fleet.capacity import Capacity
from gateway.fleet.health import PassiveHealth
from gateway.fleet.registry import Backend
from gateway.metrics import GatewayMetrics
from gateway.pipeline import spans
from gateway.pipeline.accounting import Accounting
from gateway.pipeline.context import Candidate, Dispatch
from gateway.pipeline.exchange import Exchange, Outcome
from gateway.pipeline.headers import for_backend
from gateway.pipeline.relay import Relay
from gateway.pipeline.router import Router
from gateway.protocols.base import Inbound
from gateway.protocols.dropped import KNOWN_DROPPED
from gateway.tracing.base import AttemptSpan
from gateway.upstream.client import UpstreamClient, UpstreamResponse, UpstreamTooLarge, error_kind

_MAX_ERROR_BODY = 64 * 1024


class Attempts:
    def __init__(
        self,
        capacity: Capacity,
        health: PassiveHealth,
        upstream: UpstreamClient,
        router: Router,
        relay: Relay,
        metrics: GatewayMetrics,
        accounting: Accounting,
    ) -> None:
        self._capacity = capacity
        self._health = health
        self._upstream = upstream
        self._router = router
        self._relay = relay
        self._metrics = metrics
        self._accounting = accounting

    async def run(self, dispatch: Dispatch, ex: Exchange) -> Outcome:
        """The relayed answer's outcome; raises GatewayError when nothing could be relayed (the
        caller renders it)."""
        last_error: GatewayError | None = None
        bodies: dict[tuple[str | None, str], bytes] = {}
        for tried, candidate in enumerate(dispatch.candidates):  # (at most max_attempts of them)
            backend = candidate.backend
            took_retry = False
            if tried > 0:
                if not self._capacity.try_take_retry():
                    self._metrics.retry_budget_exhausted.labels(ex.route).inc()
                    break
                took_retry = True
                self._metrics.retries.labels(ex.route, ex.pool).inc()
            ex.backend, ex.backend_name = backend, backend.name
            key = dispatch.plan.key
            cached = key.cached if key is not None else None
            ex.predicted_cached = cached.tokens(backend.name) if cached is not None else None
            gauge = self._accounting.in_flight(ex, backend)
            self._capacity.acquire(backend)
            gauge.inc(1)
            headers = sent = dispatch.headers
            name = ""
            span: AttemptSpan | None = None
            trace = ex.trace
            if trace is not None:
                if trace.recording:
                    name = candidate.model or dispatch.request.inbound.model
                    span = spans.attempt(trace, ex, backend, tried, name)
                    sent = span.headers(headers)
                else:  # not recorded: the engine is still told, so that it records nothing either
                    sent = trace.propagate(headers)
            try:
                failed = await self._attempt(dispatch, ex, candidate, sent, bodies)
            except BaseException as exc:
                if span is not None:
                    spans.attempt_raised(span, ex, exc)
                raise
            finally:
                gauge.inc(-1)
                self._capacity.release(backend)
                if took_retry:
                    self._capacity.give_back_retry()
            if span is not None:
                spans.attempt_ended(span, failed if isinstance(failed, GatewayError) else None, name)
            if not isinstance(failed, GatewayError):
                return failed
            last_error = failed
        raise last_error or NoHealthyBackend("No healthy backend is available.", retry_after=5)

    async def _attempt(
        self,
        dispatch: Dispatch,
        ex: Exchange,
        candidate: Candidate,
        headers: dict[str, str],
        bodies: dict[tuple[str | None, str], bytes],
    ) -> GatewayError | Outcome:
        """One attempt on `backend`: the outcome when it answered (an error it passed on is
        raised), or the error that lets the next backend try. `headers`: the dispatch's, with this
        attempt's trace context; `bodies`: the bodies already encoded, by model name and path."""
        request, backend, upstream_model = dispatch.request, candidate.backend, candidate.model
        protocol, inbound = request.protocol, request.inbound
        target = protocol.target(inbound, backend.engine)
        body = bodies.get((upstream_model, target.path))
        if body is None:
            body = protocol.encode(inbound, dispatch.edits, upstream_model, target)
            bodies[(upstream_model, target.path)] = body
        path = target.path
        if target.native and ex.query:
            path = f"{path}?{ex.query}"
        try:
            if ex.sent_at is None:  # the first attempt
                self._accounting.sent(ex)
            resp = await self._upstream.post(backend.url + path, body, for_backend(headers, backend), backend.name)
        except (UpstreamError, UpstreamTimeout) as exc:
            self._health.failure(backend, error_kind(exc))
            return exc
        if resp.status != 200:
            # The adapter reads the error first (docs/reliability.md defect 2): llama.cpp
            # answers some client mistakes with a 500, and those are the client's: a 400,
            # no retry, no failure counted against the backend. A 501 (the engine does not
            # serve this endpoint) is the deployment's gap: passed on, not retried, not counted.
            error = await _error_from(resp, backend)
            status = error.status_code
            if (status >= 500 and status != 501) or status == 429:
                self._health.failure(backend, "status_429" if status == 429 else "status_5xx", penalise=status >= 500)
                return error
            raise error
        self._router.learn(dispatch.plan, backend.name)
        if inbound.dropped and not target.native:
            self._said_dropped(ex, inbound)
        if upstream_model is not None:  # an alias, a backend's `model:`, or a wildcard's rewrite
            ex.served_model = upstream_model if upstream_model != inbound.model else None
            ex.headers.append((b"x-gateway-model", upstream_model.encode("latin-1", "replace")))
        try:
            if inbound.stream:
                outcome = await self._relay.stream(dispatch, ex, resp, target)
            else:
                outcome = await self._relay.body(dispatch, ex, resp, target)
        except (UpstreamError, UpstreamTimeout) as exc:
            # The backend failed after its headers but before any byte reached the client
            # (defect 7): its failure, and another backend may still answer. A first-token
            # timeout or an over-long answer would only repeat: not retried.
            self._health.failure(backend, error_kind(exc))
            if ex.response_started or isinstance(exc, UpstreamTimeout | UpstreamTooLarge):
                raise
            return exc
        if outcome == "success":
            self._health.success(backend)
        return outcome

    def _said_dropped(self, ex: Exchange, inbound: Inbound) -> None:
        """x-gateway-dropped names what the translation left out; the metric counts it by name."""
        ex.headers.append((b"x-gateway-dropped", dropped_header(inbound.dropped)))
        for name in inbound.dropped:
            label = name if name in KNOWN_DROPPED else "other"
            self._metrics.dropped_features.labels(ex.route, inbound.api, label).inc()


def dropped_header(names: Sequence[str]) -> bytes:
    """The names as one header value: only name characters, at most 512 bytes (a client's tool type
    could hold anything)."""
    safe = [re.sub(r"[^A-Za-z0-9_.:-]", "_", n)[:64] for n in names]
    return ",".join(safe).encode("ascii")[:512]


async def _error_from(resp: UpstreamResponse, backend: Backend) -> GatewayError:
    raw = await resp.read_error(_MAX_ERROR_BODY)
    norm = backend.adapter.normalise_error(resp.status, raw)
    retry_after = parse_retry_after(resp.headers.get("retry-after"), time.time())
    if retry_after is None and resp.status in (429, 503):
        retry_after = 1  # absent, or absurd (inf, 1e999): the client still gets a sane one
    if resp.status == 503:
        # Overloaded or not ready: keep the status so the client backs off as the engine asked.
        return NoHealthyBackend(
            f"Backend {backend.name} is unavailable (503).",
            code="upstream_unavailable",
            retry_after=retry_after,
        )
    return EngineError(
        norm.message, status=norm.status, type_=norm.type, code=norm.code, param=norm.param, retry_after=retry_after
    )
