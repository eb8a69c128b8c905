"""The raw-ASGI endpoint of one client protocol: read and parse the body, resolve the route, plan,
cap, admit, attempt (and relay), and always account. It is the one owner of a request's ending: a
disconnect listener runs beside the request, and whichever ends first cancels the other; the
client leaving, the idle limit and the drain deadline are told apart here and nowhere else.

A raw ASGI app, not a Starlette endpoint, so that it sees the client leave at every stage."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal

from gateway.access.gate import AccessGate, BudgetHold
from gateway.access.keys import ClientKey
from gateway.asgi import ARRIVED, CLIENT_GONE, LOOP, Receive, Scope, Send
from gateway.config import GatewayConfig, RouteConfig
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoHealthyBackend,
    NotFound,
    Overloaded,
    RateLimited,
    ShuttingDown,
    UpstreamTimeout,
)
from gateway.pipeline import spans
from gateway.pipeline.accounting import Accounting, prompt_tokens
from gateway.pipeline.admission import Admission
from gateway.pipeline.attempts import Attempts
from gateway.pipeline.body import read_body
from gateway.pipeline.context import Dispatch, EndReason, Plan, Request, read
from gateway.pipeline.enforcer import NO_PROMPT, CapEnforcer, PromptCount
from gateway.pipeline.exchange import Exchange, Outcome
from gateway.pipeline.headers import error_headers, upstream_headers
from gateway.pipeline.lifecycle import Lifecycle
from gateway.pipeline.prompt_tokens import PromptTokens
from gateway.pipeline.relay import Relay, StreamCut
from gateway.pipeline.router import Router
from gateway.policy.fairqueue import Ticket
from gateway.protocols.base import Inbound, ProtocolAdapter
from gateway.protocols.response_store import ResponseStore, not_found_body
from gateway.tracing.base import NoTracing, RequestSpan, Tracing
from gateway.value import value

log = logging.getLogger(__name__)


class RequestEnd:
    """Why a request ended early, decided once: the first end(reason) cancels the request's task;
    later ones, or any after it finished, do nothing."""

    __slots__ = ("_task", "finished", "reason")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self.reason: EndReason | None = None
        self.finished = False

    def end(self, reason: EndReason) -> None:
        if self.reason is None and not self.finished:
            self.reason = reason
            self._task.cancel()


@value
class Stages:
    """The parts that every endpoint of one gateway shares, built once by the composition root."""

    config: GatewayConfig
    access: AccessGate
    router: Router
    caps: CapEnforcer
    admission: Admission
    attempts: Attempts
    relay: Relay
    accounting: Accounting
    lifecycle: Lifecycle
    pins: ResponseStore = field(default_factory=ResponseStore)
    """Which backend holds which stored answer (Responses ids); shared by the endpoints that use it."""
    tokens: PromptTokens | None = None
    """Token ids for the kv_events pools' cache match; None: no pool routes from KV events."""
    tracing: Tracing = field(default_factory=NoTracing)


class CompletionEndpoint:
    def __init__(
        self, protocol: ProtocolAdapter, stages: Stages, variants: Mapping[str, ProtocolAdapter] | None = None
    ) -> None:
        self.protocol = protocol
        self._tracing = stages.tracing
        # Route label -> the adapter that route gets instead (reasoning_content: copy); empty for most.
        self._variants: Mapping[str, ProtocolAdapter] = variants or {}
        self.path = protocol.path
        self._config = stages.config
        self._access = stages.access
        self._router = stages.router
        self._caps = stages.caps
        self._admission = stages.admission
        self._attempts = stages.attempts
        self._relay = stages.relay
        self._accounting = stages.accounting
        self._lifecycle = stages.lifecycle
        self._tokens = stages.tokens
        self._pins = stages.pins
        self._balancers = {name: pool.balancer for name, pool in stages.config.pools.items()}
        # Request ids: a random per-endpoint prefix and a counter; os.urandom per request was a syscall.
        self._id_prefix = os.urandom(6).hex()
        self._id_counter = itertools.count(1)

    def _request_id(self, supplied: str | None) -> str:
        if supplied is not None and _valid_request_id(supplied):
            return supplied
        return f"{self._id_prefix}{next(self._id_counter):08x}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        protocol = self.protocol
        headers = _headers(scope)
        ex = Exchange(request_id=self._request_id(headers.get("x-request-id")), api=protocol.api, path=self.path)
        arrived = scope.get(ARRIVED)  # set by serving/protocol.py; absent under another server
        if arrived is not None:
            ex.started = arrived
            ex.scope = scope  # type: ignore[assignment]  # (a TypedDict to starlette)
        trace: RequestSpan | None = None
        if self._tracing.enabled:  # the server span, under the client's traceparent if any
            trace = ex.trace = self._tracing.request(scope["method"], ex.path, headers, ex.started)
            if trace.recording:
                spans.begin(trace, ex, scope["method"])
        task = asyncio.current_task(scope.get(LOOP))  # the loop from the server: no getpid() (asgi.LOOP)
        assert task is not None
        ending = RequestEnd(task)
        watcher: asyncio.Task[None] | None = None
        left: Callable[[], None] | None = None
        count: PromptCount = NO_PROMPT
        client: ClientKey | None = None
        ticket: Ticket | None = None
        held: BudgetHold | None = None
        queued = False
        # What ended the request, decided below and recorded once, in `finally`. "" until then, not
        # None: the compiled build (mypyc) reads an Optional local of this coroutine as a str in
        # `finally` after the early return, and raises TypeError on None.
        outcome: Outcome | Literal[""] = ""
        decided: Plan | None = None
        """A kv_events plan whose decision still counts as pending load on its backend."""
        try:
            if self._lifecycle.draining:
                raise NoHealthyBackend("The gateway is shutting down.", code="draining", retry_after=1)
            client = self._access.authenticate(headers.get("authorization"), headers.get("x-api-key"))
            raw = await read_body(receive, headers, self._config.limits.max_body_bytes)
            if raw is None:
                ex.disconnect_stage = "before_backend"
                return
            inbound = protocol.parse(raw, self._config.limits)
            resolved = self._router.resolve(inbound.model)  # aliases, then the route
            if resolved is None:
                raise ModelNotFound(
                    f"The model '{_clip(inbound.model)}' does not exist on this gateway.", param="model"
                )
            route = resolved.route
            ex.route, ex.model, ex.stream = route.label, inbound.model, inbound.stream
            query = scope.get("query_string")
            if query:
                ex.query = query.decode("latin-1")
            if self._variants:
                protocol = self._variants.get(route.label, protocol)
            await self._access.admit(client, inbound.model)  # the key's model allowlist and limits
            gone = scope.get(CLIENT_GONE)
            if gone is not None:  # the gateway's own server calls back; no task a request
                left = functools.partial(_client_left, ex, ending)
                gone.watch(left)
            else:
                watcher = asyncio.create_task(_listen_for_disconnect(receive, ex, ending))
            request = read(protocol, inbound, route, resolved.name, headers)
            estimate = self._caps.routing_estimate(request)
            if inbound.pin is None:
                ids = None
                if self._tokens is not None and self._tokens.wanted(route):
                    ids = self._tokens.ids(route, resolved.name, request.view)
                plan = self._router.plan(request, estimate, ids)
                decided = plan
                if plan.explanation is not None:
                    ex.headers.append((b"x-gateway-balancer", plan.explanation.encode("latin-1", "replace")))
            else:
                plan = self._pinned(request, estimate)
            ex.pool, ex.rule = plan.pool, plan.rule
            ticket = self._admission.ticket(client, request, estimate)
            held = await self._access.hold(client, estimate, self._admission.output_tokens(inbound.max_tokens))
            admit_start = time.perf_counter() if trace is not None and trace.recording else 0.0
            backends, plan, queued = await self._admission.admit(plan, route.label, ticket)
            if trace is not None and trace.recording:
                balancer = self._balancers.get(plan.pool, "none")
                spans.routed(trace, inbound, plan, backends, balancer, admit_start if queued else None)
            candidates = self._router.candidates(plan, backends, request, self._config.retry.max_attempts)
            cap_edits, count = await self._caps.apply(request, candidates[0])
            ex.estimator_key, ex.prompt_chars, ex.prompt_messages = count.key, count.chars, count.messages
            ex.prompt_estimate, ex.prompt_exact = count.estimate, count.exact
            edits = protocol.base_edits(inbound).then(cap_edits)
            ex.headers.extend(edits.headers)
            if decided is not None:  # the attempt takes its in_flight slot before it first awaits
                self._router.started(decided)
                decided = None
            upstream = upstream_headers(headers, ex.request_id)
            dispatch = Dispatch(request, plan, candidates, edits, upstream, send, ending)
            outcome = await self._attempts.run(dispatch, ex)
        except GatewayError as err:
            outcome = _outcome_for(err)
            if not ex.response_started:
                await _send_error(send, protocol, err, ex)
        except Exception:  # a bug: still one error body and one outcome, never a bare traceback
            log.exception("request %s failed", ex.request_id)
            outcome = "internal_error"
            if not ex.response_started:
                bug = GatewayError("The gateway failed on this request.", code="internal_error")
                await _send_error(send, protocol, bug, ex)
        except asyncio.CancelledError:
            # The one place that tells why a request was cancelled, and the only uncancel().
            if ending.reason == "client_left":
                task.uncancel()
                outcome = "client_closed"
            elif ending.reason == "idle_limit":
                task.uncancel()
                cut = StreamCut("timeout_idle", f"Backend {ex.backend_name} stalled mid-stream.")
                try:
                    outcome = await self._relay.cut(ex, send, protocol, cut)
                except GatewayError as err:  # stalled before the client got its headers
                    outcome = _outcome_for(err)
                    await _send_error(send, protocol, err, ex)
            elif self._lifecycle.draining:
                # The drain deadline passed with this request still running: tell the client, once.
                task.uncancel()
                outcome = "overloaded"
                await _send_shutdown(send, protocol, ex)
            else:
                raise
        finally:
            if outcome:  # the only write: accounting and the access log read it
                ex.outcome = outcome  # (a client gone before its body came leaves the default, None)
            if decided is not None:
                self._router.started(decided)
            ending.finished = True
            if watcher is not None:
                watcher.cancel()
            elif left is not None:
                scope[CLIENT_GONE].unwatch(left)
            if ex.answer_id is not None:
                self._pins.put(ex.answer_id, ex.backend_name)
            self._accounting.finish(ex)
            usage = ex.reported_usage()
            sent = ex.sent_at is not None
            self._access.account(client, usage, ex.prompt_estimate if sent else 0, ex.streamed_tokens, held)
            if ex.outcome == "success" and usage is not None:
                self._caps.learn(count, prompt_tokens(usage))
            if queued and ticket is not None:
                self._admission.settle(ex.pool, ticket, usage)
            if trace is not None and trace.recording:
                spans.finish(trace, ex)

    def _pinned(self, request: Request, estimate: int) -> Plan:
        """The plan of a request that names stored state: the one backend that holds it, or OpenAI's 404
        when no live backend of the route does (unknown id, forgotten past the bound, backend gone)."""
        inbound = request.inbound
        assert inbound.pin is not None
        plan = self._router.pinned(request, self._pins.get(inbound.pin), estimate)
        if plan is None:
            self._refuse_everywhere(request.route, inbound)
            body = not_found_body(_clip(inbound.pin, 200))["error"]
            raise NotFound(body["message"], param="previous_response_id", code=body["code"])
        if plan.saturated:
            raise Overloaded(
                f"The backend that holds '{_clip(inbound.pin)}' is at its concurrency limit.", retry_after=1
            )
        return plan

    def _refuse_everywhere(self, route: RouteConfig, inbound: Inbound) -> None:
        """When no backend of the route could take the request at all (Responses' previous_response_id
        where every engine is translated), raise that 400 rather than a 404 for the id."""
        refusal: GatewayError | None = None
        for kind in self._router.engine_kinds(route):
            try:
                self.protocol.target(inbound, kind)
                return
            except InvalidRequest as err:
                refusal = err
        if refusal is not None:
            raise refusal


async def _listen_for_disconnect(receive: Receive, ex: Exchange, ending: RequestEnd) -> None:
    """Runs beside the request under a server without the CLIENT_GONE hook: when the client goes,
    end the request so that the upstream connection is closed and the engine stops work."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    _client_left(ex, ending)


def _client_left(ex: Exchange, ending: RequestEnd) -> None:
    """The client's connection was lost: note the stage and end the request."""
    if ending.finished:
        return
    if ex.sent_at is None:
        ex.disconnect_stage = "before_backend"
    elif ex.response_started:
        ex.disconnect_stage = "mid_stream"
    elif ex.stream:
        ex.disconnect_stage = "waiting_first_byte"
    else:
        ex.disconnect_stage = "non_stream"
    ending.end("client_left")


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _valid_request_id(supplied: str) -> bool:
    return 0 < len(supplied) <= 128 and supplied.isascii() and supplied.isprintable()


def _clip(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _outcome_for(err: GatewayError) -> Outcome:
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


async def _send_shutdown(send: Send, protocol: ProtocolAdapter, ex: Exchange) -> None:
    err = ShuttingDown()
    try:
        if ex.response_started:
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + protocol.error_body(err) + b"\n\n",
                    "more_body": False,
                }
            )
        else:
            await _send_error(send, protocol, err, ex)
    except Exception:  # the connection may already be gone; nothing more to tell
        return


async def _send_error(send: Send, protocol: ProtocolAdapter, err: GatewayError, ex: Exchange) -> None:
    body = protocol.error_body(err)
    ex.status = protocol.error_status(err)
    await send({"type": "http.response.start", "status": ex.status, "headers": error_headers(err, body, ex)})
    await send({"type": "http.response.body", "body": body, "more_body": False})
