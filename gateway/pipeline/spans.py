"""What a request's record tells its trace: the server span's attributes (the GenAI semantic
conventions' names where they have one, `gateway.*` for the routing), the queue wait, each upstream
attempt, the first token and the ending. Called only where a request has a trace."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from gateway.errors import GatewayError
from gateway.fleet.registry import Backend
from gateway.pipeline.context import Plan
from gateway.pipeline.exchange import Exchange
from gateway.protocols.base import Inbound
from gateway.tracing.base import AttemptSpan, Attributes, RequestSpan

# gen_ai.operation.name of each protocol (the conventions' well-known values where one fits).
_OPERATION = {
    "chat": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
_USAGE = (("prompt_tokens", "gen_ai.usage.input_tokens"), ("completion_tokens", "gen_ai.usage.output_tokens"))
_MAX_ORDER = 8
"""The backends named in gateway.backends_in_order: the first few are the ones that matter."""


def operation(api: str) -> str:
    return _OPERATION.get(api, api)


def begin(trace: RequestSpan, ex: Exchange, method: str) -> None:
    """The recorded server span's first attributes (the tracer made it at the request's arrival)."""
    trace.set(
        {
            "http.request.method": method,
            "url.path": ex.path,
            "http.route": ex.path,
            "gen_ai.operation.name": operation(ex.api),
            "gateway.request_id": ex.request_id,
        }
    )


def routed(
    trace: RequestSpan,
    inbound: Inbound,
    plan: Plan,
    backends: Sequence[Backend],
    balancer: str,
    queued_from: float | None,
) -> None:
    """The routing decision on the server span (`balancer`: the pool's); a `gateway.queue` span
    when the request waited, from `queued_from`."""
    now = time.perf_counter()
    queued = queued_from is not None
    if queued_from is not None:
        trace.child("gateway.queue", queued_from, now, {"gateway.pool": plan.pool})
    attributes: dict[str, str | bool | int | float | Sequence[str]] = {
        "gateway.balancer": balancer,
        "gateway.balancer.reason": _balancer_reason(balancer, plan, backends),
        "gateway.backends_in_order": [b.name for b in backends[:_MAX_ORDER]],
        "gateway.queued": queued,
        "gen_ai.request.stream": inbound.stream,
    }
    if queued_from is not None:
        attributes["gateway.queue_wait_s"] = now - queued_from
    if inbound.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = inbound.max_tokens
    if plan.home is not None:
        attributes["gateway.balancer.home"] = plan.home
    trace.set(attributes)
    trace.content("gen_ai.prompt", inbound.raw)


def _balancer_reason(balancer: str, plan: Plan, backends: Sequence[Backend]) -> str:
    """Why the first backend is first, in a word: the balancer's memory, the session, or its order."""
    first = backends[0].name if backends else None
    if plan.rule == "pinned":
        return "pinned"
    if plan.home is not None:
        return "learned_home" if first == plan.home else "home_unavailable"
    if balancer == "session" and plan.key is not None and plan.key.session is not None:
        return "session_hash"
    if balancer == "prefix_affinity":
        return "no_home_least_load"
    return balancer


@functools.lru_cache(maxsize=1024)
def address(url: str) -> tuple[str, int]:
    """A backend URL's host and port (memoised: a fleet has a bounded set of URLs)."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def attempt(trace: RequestSpan, ex: Exchange, backend: Backend, tried: int, model: str) -> AttemptSpan:
    """An upstream attempt's client span, started now."""
    host, port = address(backend.url)
    attributes: Attributes = {
        "gen_ai.operation.name": operation(ex.api),
        "gen_ai.request.model": model,
        "gen_ai.provider.name": backend.engine,
        "server.address": host,
        "server.port": port,
        "gateway.backend": backend.name,
        "gateway.pool": backend.pool,
        "gateway.attempt": tried + 1,
    }
    return trace.attempt(f"{operation(ex.api)} {model}", time.perf_counter(), attributes)


def attempt_ended(span: AttemptSpan, failed: GatewayError | None, model: str) -> None:
    if failed is None:
        span.end({"gen_ai.response.model": model, "gateway.attempt.result": "answered"}, None)
    else:
        span.end(_error_attributes(failed), failed.message)


def attempt_raised(span: AttemptSpan, ex: Exchange, exc: BaseException) -> None:
    if isinstance(exc, asyncio.CancelledError):
        why = "client_left" if ex.disconnect_stage is not None else "cancelled"
        span.end({"error.type": why, "gateway.attempt.result": why}, why)
    elif isinstance(exc, GatewayError):
        span.end(_error_attributes(exc), exc.message)
    else:
        span.end({"error.type": type(exc).__name__, "gateway.attempt.result": "error"}, type(exc).__name__)


def _error_attributes(err: GatewayError) -> Attributes:
    return {
        "error.type": err.code or type(err).__name__,
        "http.response.status_code": err.status_code,
        "gateway.attempt.result": "failed",
    }


def finish(trace: RequestSpan, ex: Exchange) -> None:
    """The ending on the server span: outcome, status, usage, the first token; then it ends.
    Only for a recorded trace (one left out has nothing to end)."""
    now = time.perf_counter()
    outcome = ex.outcome or "client_closed"
    attributes: dict[str, str | bool | int | float | Sequence[str]] = {
        "gateway.outcome": outcome,
        "http.response.status_code": ex.status,
        "gateway.route": ex.route,
        "gateway.pool": ex.pool,
        "gateway.rule": ex.rule,
        "gateway.backend": ex.backend_name,
    }
    if ex.model is not None:
        attributes["gen_ai.request.model"] = ex.model
        if ex.backend is not None:  # the name the engine served (the client gets its own back)
            attributes["gen_ai.response.model"] = ex.served_model or ex.model
    usage = ex.reported_usage()
    if usage is not None:
        for key, name in _USAGE:
            count = usage.get(key)
            if isinstance(count, int) and not isinstance(count, bool):
                attributes[name] = count
    obs = ex.observer
    if obs is not None and obs.first_token_at is not None:
        ttft = obs.first_token_at - ex.started
        attributes["gen_ai.server.time_to_first_token"] = ttft
        trace.event("gen_ai.first_token", obs.first_token_at, {"gen_ai.server.time_to_first_token": ttft})
    error: str | None = None
    if outcome == "client_closed":
        stage = ex.disconnect_stage or "before_backend"
        attributes["gateway.disconnect_stage"] = stage
        attributes["error.type"] = "client_closed"
        error = f"the client closed the connection ({stage})"
        trace.event("gateway.client_left", now, {"gateway.disconnect_stage": stage})
    elif outcome != "success" and (outcome != "rejected_4xx" or ex.status >= 500):
        attributes["error.type"] = outcome
        error = outcome
    elif outcome == "rejected_4xx":
        attributes["error.type"] = str(ex.status)
    trace.end(attributes, error, now)
