"""The ASGI endpoint for /v1/chat/completions, /v1/completions and /v1/embeddings: read and parse
the body, route, cap, balance, hand over to the proxy, and always finish the Exchange.

It is a raw ASGI app, not a Starlette endpoint, so that it can watch for the client leaving at
every stage and cancel the upstream work at once."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.access.gate import AccessGate
from gateway.access.keys import ClientKey
from gateway.config import GatewayConfig
from gateway.enforcer import CapEnforcer
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoHealthyBackend,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    ShuttingDown,
    UpstreamTimeout,
)
from gateway.exchange import Exchange
from gateway.inbound import Kind, parse_request
from gateway.lifecycle import Lifecycle
from gateway.metrics import GatewayMetrics
from gateway.proxy import Proxy
from gateway.registry import Backend, Registry
from gateway.router import Plan, Router

log = logging.getLogger(__name__)

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# Never forwarded: hop-by-hop headers (RFC 9110 7.6.1), the client's credentials, and headers the
# gateway sets itself. The backend's own key is added by the proxy.
_DROP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "api-key",
        "accept-encoding",
        "content-encoding",  # the gateway forwards the JSON it parsed: identity, whatever the client said
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
        "x-client-ip",
        "true-client-ip",
        "cf-connecting-ip",
        "openai-organization",
        "openai-project",
    }
)
# Any other header whose name says it carries a credential (x-goog-api-key, anthropic-api-key,
# x-auth-token, ...) is dropped too: the backend's own key is the only one sent.
_CREDENTIAL_WORDS = ("api-key", "api_key", "apikey", "auth", "token", "secret", "password", "session-key")


class CompletionEndpoint:
    def __init__(
        self,
        kind: Kind,
        config: GatewayConfig,
        registry: Registry,
        router: Router,
        caps: CapEnforcer,
        proxy: Proxy,
        metrics: GatewayMetrics,
        lifecycle: Lifecycle,
        access: AccessGate,
    ) -> None:
        self.kind = kind
        self._lifecycle = lifecycle
        self._config = config
        self._registry = registry
        self._router = router
        self._caps = caps
        self._proxy = proxy
        self._metrics = metrics
        # Request ids: a random per-endpoint prefix and a counter; os.urandom per request was a syscall.
        self._id_prefix = os.urandom(6).hex()
        self._id_counter = itertools.count(1)
        self._access = access

    @property
    def path(self) -> str:
        return _PATHS[self.kind]

    def _request_id(self, supplied: str | None) -> str:
        if supplied is not None and _valid_request_id(supplied):
            return supplied
        return f"{self._id_prefix}{next(self._id_counter):08x}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        ex = Exchange(request_id=self._request_id(headers.get("x-request-id")), kind=self.kind, metrics=self._metrics)
        task = asyncio.current_task()
        assert task is not None
        watcher: asyncio.Task[None] | None = None
        client: ClientKey | None = None
        try:
            if self._lifecycle.draining:
                raise NoHealthyBackend("The gateway is shutting down.", code="draining", retry_after=1)
            client = self._access.authenticate(headers.get("authorization"))
            raw = await _read_body(receive, headers, self._config.limits.max_body_bytes)
            if raw is None:
                ex.disconnect_stage = "before_backend"
                return
            limits = self._config.limits
            inbound = parse_request(
                self.kind,
                raw,
                max_depth=limits.max_json_depth,
                max_n=limits.max_n,
                max_messages=limits.max_messages,
                max_nodes=limits.max_json_nodes,
                max_containers=limits.max_json_containers,
            )
            route = self._config.route_for(inbound.model)
            if route is None:
                raise ModelNotFound(
                    f"The model '{_clip(inbound.model)}' does not exist on this gateway.", param="model"
                )
            ex.route, ex.inbound, ex.upstream_model = route.label, inbound, route.upstream_model
            await self._access.admit(client, inbound.model)  # the key's model allowlist and limits
            watcher = asyncio.create_task(_watch_disconnect(receive, task, ex))
            plan = self._router.plan(route, inbound, headers, self._caps.routing_estimate(route, inbound))
            ex.pool, ex.rule = plan.pool, plan.rule
            backends = await self._admit(plan, route.label)
            await self._caps.apply(ex, route, backends[0])
            if inbound.stream and not inbound.include_usage and inbound.kind != "embeddings":
                # Ask for the usage chunk so token counts are exact; the relay strips it again.
                inbound.body["stream_options"] = {**(inbound.body.get("stream_options") or {}), "include_usage": True}
                inbound.modified = ex.injected_usage = True
            await self._proxy.forward(ex, send, raw, _upstream_headers(headers, ex.request_id), backends)
        except GatewayError as err:
            if ex.outcome is None:
                ex.outcome = _outcome_for(err)
            if not ex.response_started:
                ex.status = err.status_code
                await _send_error(send, err, ex)
        except Exception:  # a bug: still one OpenAI-shaped 500 and one outcome, never a bare traceback
            log.exception("request %s failed", ex.request_id)
            if ex.outcome is None:
                started = ex.response_started
                ex.outcome = "upstream_error_midstream" if started else "upstream_error_before_first_byte"
            if not ex.response_started:
                ex.status = 500
                await _send_error(send, GatewayError("The gateway failed on this request.", code="internal_error"), ex)
        except asyncio.CancelledError:
            if ex.disconnect_stage is not None:
                task.uncancel()
                ex.outcome = "client_closed"
            elif self._lifecycle.draining:
                # The drain deadline passed with this request still running: tell the client, once.
                task.uncancel()
                ex.outcome = "overloaded"
                await _send_shutdown(send, ex)
            else:
                raise
        finally:
            ex.finished = True
            if watcher is not None:
                watcher.cancel()
            ex.finish()
            usage = ex.reported_usage()
            self._access.account(client, usage, ex.prompt_estimate + ex.streamed_tokens if ex.sent_at else 0)
            if usage is not None and ex.outcome == "success":
                self._caps.learn(
                    ex, usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
                )

    async def _admit(self, plan: Plan, route: str) -> list[Backend]:
        """The backends to try; when every one is full, wait in the bounded queue for a slot."""
        started = time.perf_counter()
        backends = plan.backends
        limits = self._config.limits
        deadline = started + limits.queue_timeout_s
        saturated = plan.saturated
        while not backends and saturated and plan.key is not None:
            left = deadline - time.perf_counter()
            if not await self._registry.wait_for_slot(plan.pool, left, limits.max_queue):
                raise Overloaded(f"Every backend of pool '{plan.pool}' is at its concurrency limit.", retry_after=1)
            backends, saturated = self._router.order(plan.pool, plan.key)
        if not backends:
            raise NoHealthyBackend(f"No healthy backend can serve route '{route}'.", retry_after=5)
        self._metrics.child(self._metrics.queue_wait, route, plan.pool).observe(time.perf_counter() - started)
        return backends


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], ex: Exchange) -> None:
    """Runs beside the request; when the client goes, cancel the request's task so that the
    upstream connection is closed and the engine stops work."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    if ex.finished:
        return
    if ex.sent_at is None:
        ex.disconnect_stage = "before_backend"
    elif ex.response_started:
        ex.disconnect_stage = "mid_stream"
    elif ex.inbound is not None and ex.inbound.stream:
        ex.disconnect_stage = "waiting_first_byte"
    else:
        ex.disconnect_stage = "non_stream"
    task.cancel()


async def _read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("Content-Length is not a number.", code="invalid_header")
        if int(declared) > limit:
            raise PayloadTooLarge(f"The request body is larger than the {limit}-byte limit.")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                await _discard(receive, message, 1 << 20)
                raise PayloadTooLarge(f"The request body is larger than the {limit}-byte limit.")
            parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _discard(receive: Receive, message: MutableMapping[str, Any], budget: int) -> None:
    """Read and drop up to `budget` more bytes of an oversized body, so that a client which
    writes its whole body before reading can still read the 413 (else it sees a reset)."""
    while message.get("more_body", False) and budget > 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        budget -= len(message.get("body", b""))


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _upstream_headers(headers: dict[str, str], request_id: str) -> dict[str, str]:
    named = headers.get("connection", "")
    drop = _DROP | {t.strip().lower() for t in named.split(",")} if named else _DROP
    out: dict[str, str] = {}
    for name, value in headers.items():
        if name in drop or name.startswith("x-gateway-") or any(w in name for w in _CREDENTIAL_WORDS):
            continue
        if not value.isascii():
            # The ASGI server gave the raw bytes as latin-1; aiohttp would encode them as UTF-8 again
            # (café -> cafÃ©). Send the client's bytes as they came, or drop a value that is not UTF-8.
            try:
                value = value.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                continue
        out[name] = value
    out["content-type"] = "application/json"
    out["accept-encoding"] = "identity"
    out["x-request-id"] = request_id
    return out


def _valid_request_id(supplied: str) -> bool:
    return 0 < len(supplied) <= 128 and supplied.isascii() and supplied.isprintable()


def _clip(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _outcome_for(err: GatewayError) -> str:
    if isinstance(err, RateLimited):
        return "rejected_4xx"  # the client's own quota, not the gateway's capacity
    if isinstance(err, Overloaded | NoHealthyBackend):
        return "overloaded"
    if isinstance(err, UpstreamTimeout):
        return "timeout_ttfb"
    if err.status_code == 429:
        return "overloaded"
    if err.status_code < 500:
        return "rejected_4xx"
    return "upstream_error_before_first_byte"


async def _send_shutdown(send: Send, ex: Exchange) -> None:
    err = ShuttingDown()
    try:
        if ex.response_started:
            await send(
                {"type": "http.response.body", "body": b"data: " + err.body_bytes() + b"\n\n", "more_body": False}
            )
        else:
            ex.status = err.status_code
            await _send_error(send, err, ex)
    except Exception:  # the connection may already be gone; nothing more to tell
        return


async def _send_error(send: Send, err: GatewayError, ex: Exchange) -> None:
    body = err.body_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in err.headers().items()]
    headers += ex.response_headers()
    if isinstance(err, PayloadTooLarge):
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
