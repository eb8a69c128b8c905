"""The routing decision of one request, for a data plane that moves the bytes itself: the same steps,
in the same order, as the HTTP endpoint (gateway/pipeline/endpoint.py) up to the attempt: the key,
the body through the protocol adapter, the route, the key's allowlist and limits, the plan (rules
and balancer), admission, the cap, the encoded body. What comes back is where to send it (Pick),
never the bytes' relay; the answer's observation ends it (Picker.finish)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gateway.access.gate import BudgetHold
from gateway.access.keys import ClientKey
from gateway.app.instance import Gateway
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoHealthyBackend,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
)
from gateway.fleet.health import PassiveHealth
from gateway.fleet.registry import Backend
from gateway.pipeline.accounting import prompt_tokens
from gateway.pipeline.context import Plan, read
from gateway.pipeline.enforcer import NO_PROMPT, PromptCount
from gateway.pipeline.exchange import Exchange, Outcome
from gateway.policy.fairqueue import Ticket
from gateway.protocols.base import Inbound, ProtocolAdapter, SseObserver, Target
from gateway.protocols.catalog import ENDPOINTS, REASONING_COPY
from gateway.protocols.rename import ModelRename

CREDENTIALS = ("authorization", "x-api-key", "api-key")
"""The client's key headers: the gateway's own keys, never sent to an engine (as `gateway serve`)."""


@dataclass(eq=False)
class Pick:
    """Where one request goes, what it carries there, and the record its answer fills in."""

    ex: Exchange
    protocol: ProtocolAdapter
    inbound: Inbound
    plan: Plan
    backend: Backend
    target: Target
    address: str
    """ip:port of the backend: the x-gateway-destination-endpoint value."""
    fallback: str | None
    """ip:port of the next backend in the balancer's order, for a data plane that tries one more."""
    body: bytes | None
    """The body to send, or None: the client's bytes as they are."""
    path: str | None
    """The upstream path when it is not the client's (an engine's own name for the endpoint)."""
    set_headers: dict[str, str]
    remove_headers: tuple[str, ...]
    client: ClientKey | None
    held: BudgetHold | None
    count: PromptCount
    ticket: Ticket | None = None
    """The queue ticket of a request that waited for its slot: its key's fair share is settled at the end."""
    observer: SseObserver | None = None
    rename: ModelRename | None = None
    """The client's model name back in the answer, where the engine was sent another (an alias)."""
    answer: list[bytes] = field(default_factory=list)
    """A non-stream answer's bytes, for its usage."""
    answered: bool = False
    """The backend's response headers came (its status in ex.status)."""


@dataclass(frozen=True)
class Asked:
    """What the data plane sent of one request, once its body is whole."""

    path: str
    headers: Mapping[str, str]
    """Lower-case names, pseudo-headers (:path, :method) included."""
    body: bytes
    subset: frozenset[str] | None = None
    """The ip:port endpoints the data plane allows (its envoy.lb.subset_hint metadata); None: any."""
    arrived: float | None = None
    """perf_counter() when the request's headers came."""


@dataclass(frozen=True)
class Refusal:
    """An answer the data plane sends itself, in the client's protocol: status, headers, JSON body."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]


class Picker:
    def __init__(self, gw: Gateway) -> None:
        self._gw = gw
        self._by_path = {p.path: p for p in ENDPOINTS}
        self._copy_routes = frozenset(r.label for r in gw.config.routes if r.reasoning_content == "copy")
        """The routes that get REASONING_COPY's adapter instead of their endpoint's."""
        self._addresses: dict[str, str] = {}
        # What Envoy's answers say of a backend, counted as `gateway serve` counts its own attempts'.
        self._passive = PassiveHealth(gw.health_state, gw.metrics)

    @property
    def gateway(self) -> Gateway:
        return self._gw

    def protocol(self, path: str) -> ProtocolAdapter | None:
        """The adapter for a request path (the query string aside); None: not a path the gateway serves."""
        return self._by_path.get(path.split("?", 1)[0])

    def refusal(self, protocol: ProtocolAdapter | None, err: GatewayError) -> Refusal:
        protocol = protocol or self._by_path["/v1/chat/completions"]
        headers = (("content-type", "application/json"), *err.headers().items())
        return Refusal(protocol.error_status(err), protocol.error_body(err), headers)

    async def pick(self, asked: Asked) -> Pick:
        """The plan for one request; raises GatewayError (the caller answers it with refusal()),
        counted as `gateway serve` counts a refusal."""
        protocol = self.protocol(asked.path)
        if protocol is None:
            raise NotFound(f"The gateway does not route {asked.path.split('?', 1)[0][:64]}.", code="unknown_path")
        request_id = asked.headers.get("x-request-id", "")[:128] or "-"
        ex = Exchange(request_id=request_id, api=protocol.api, path=protocol.path)
        if asked.arrived is not None:
            ex.started = asked.arrived
        progress = _Progress()
        try:
            return await self._pick(ex, protocol, asked, progress)
        except BaseException as err:
            if isinstance(err, GatewayError):
                ex.status = protocol.error_status(err)
                ex.outcome = _outcome_for(err, ex.status)
                self._gw.accounting.finish(ex)
            # A budget hold taken before the refusal (or before the client left) is given back.
            self._gw.access.account(progress.client, None, 0, 0, progress.held)
            raise

    async def _pick(self, ex: Exchange, protocol: ProtocolAdapter, asked: Asked, progress: _Progress) -> Pick:
        gw = self._gw
        headers, raw, subset = asked.headers, asked.body, asked.subset
        client = progress.client = gw.access.authenticate(headers.get("authorization"), headers.get("x-api-key"))
        limit = gw.config.limits.max_body_bytes
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body is larger than the {limit}-byte limit.")
        inbound = protocol.parse(raw, gw.config.limits)
        resolved = gw.router.resolve(inbound.model)
        if resolved is None:
            name = inbound.model if len(inbound.model) <= 64 else inbound.model[:64] + "..."
            raise ModelNotFound(f"The model '{name}' does not exist on this gateway.", param="model")
        route = resolved.route
        ex.route, ex.model, ex.stream = route.label, inbound.model, inbound.stream
        if route.label in self._copy_routes:
            variant = REASONING_COPY.get(protocol.api)
            protocol = variant if variant is not None and variant.path == protocol.path else protocol
        await gw.access.admit(client, inbound.model)
        request = read(protocol, inbound, route, resolved.name, headers)
        estimate = gw.caps.routing_estimate(request)
        if inbound.pin is not None:
            raise InvalidRequest(
                "previous_response_id needs the backend that stored the response: use `gateway serve`.",
                param="previous_response_id",
            )
        ids = None
        if gw.tokens is not None and gw.tokens.wanted(route):
            ids = gw.tokens.ids(route, resolved.name, request.view)
        plan = gw.router.plan(request, estimate, ids)
        try:
            ex.pool, ex.rule = plan.pool, plan.rule
            ticket = gw.admission.ticket(client, request, estimate)
            held = progress.held = await gw.access.hold(
                client, estimate, gw.admission.output_tokens(inbound.max_tokens)
            )
            backends, plan, queued = await gw.admission.admit(plan, route.label, ticket)
            if subset is not None:
                backends = [b for b in backends if await self._address(b) in subset]
                if not backends:
                    raise NoHealthyBackend(
                        f"No backend of route '{route.label}' is among the endpoints the data plane allows.",
                        retry_after=5,
                    )
            # The pick and the next in the balancer's order (the fallback), each with its model name.
            candidates = gw.router.candidates(plan, backends, request, 2)
            backend, model = candidates[0].backend, candidates[0].model
            cap_edits, count = await gw.caps.apply(request, candidates[0])
        finally:
            gw.router.started(plan)
        target = protocol.target(inbound, backend.engine)
        if not target.native:
            # The data plane relays the answer's bytes as they are: a translated protocol would need
            # its answer rewritten too, which only `gateway serve` does.
            raise InvalidRequest(
                f"The {backend.engine} engine does not serve {protocol.path} itself; "
                "the gateway translates it only under `gateway serve`.",
                code="translation_unavailable",
            )
        base = protocol.base_edits(inbound)
        edits = base.then(cap_edits)
        ex.headers.extend(edits.headers)
        body = protocol.encode(inbound, edits, model, target)
        ex.estimator_key, ex.prompt_chars, ex.prompt_messages = count.key, count.chars, count.messages
        ex.prompt_estimate, ex.prompt_exact = count.estimate, count.exact
        ex.backend, ex.backend_name = backend, backend.name
        ex.served_model = model if model is not None and model != inbound.model else None
        address = await self._address(backend)
        fallback = await self._address(candidates[1].backend) if len(candidates) > 1 else None
        set_headers = {"x-gateway-destination-endpoint": address, **backend.auth_headers()}
        pick = Pick(
            ex=ex,
            protocol=protocol,
            inbound=inbound,
            plan=plan,
            backend=backend,
            target=target,
            address=address,
            fallback=fallback,
            body=None if body is inbound.raw else body,
            path=target.path if target.path != protocol.path else None,
            set_headers=set_headers,
            remove_headers=tuple(h for h in CREDENTIALS if h not in set_headers),
            client=client,
            held=held,
            count=count,
            ticket=ticket if queued else None,
        )
        if ex.served_model is not None:
            pick.rename = ModelRename(ex.served_model, inbound.model)
        if inbound.stream:
            pick.observer = ex.observer = protocol.observer(inbound, edits, target)
            pick.observer.limit_events(gw.config.limits.max_event_bytes)
        gw.capacity.acquire(backend)  # until finish(): the balancers see this request's load
        gw.accounting.sent(ex)
        return pick

    async def _address(self, backend: Backend) -> str:
        """ip:port for the backend's URL: Envoy's ORIGINAL_DST cluster takes an address, not a name."""
        known = self._addresses.get(backend.url)
        if known is not None:
            return known
        url = urlsplit(backend.url)
        host = url.hostname or "127.0.0.1"
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=0, proto=6)
            ip = ipaddress.ip_address(infos[0][4][0])
        address = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
        self._addresses[backend.url] = address
        return address

    def answered(self, pick: Pick, status: int) -> None:
        """The backend's response headers: its first byte, for the balancers' memory."""
        pick.answered = True
        pick.ex.status = status
        pick.ex.response_started = True
        if status == 200:
            self._gw.router.learn(pick.plan, pick.backend.name)
        elif (status >= 500 and status != 501) or status == 429:
            # Envoy's own 503 when the engine cannot be reached counts here too: a dead engine is
            # ejected after health.unhealthy_after of them, before its next active check.
            kind = "status_429" if status == 429 else "status_5xx"
            self._passive.failure(pick.backend, kind, penalise=status >= 500)

    def answer_chunk(self, pick: Pick, chunk: bytes) -> bytes:
        """One chunk of the answer on its way to the client: observed (first token, gaps, usage) and
        returned as the client gets it: a stream's usage event the client did not ask for dropped,
        the client's model name back where an alias sent another, as `gateway serve` relays it."""
        if pick.ex.status != 200:
            return chunk
        if pick.observer is not None:
            chunk = pick.observer.feed(chunk, time.perf_counter())
        else:
            pick.answer.append(chunk)
        return pick.rename.feed(chunk) if pick.rename is not None else chunk

    def answer_end(self, pick: Pick) -> bytes:
        """The answer's end: what the observer and the rename still held."""
        if pick.ex.status != 200:
            return b""
        out = pick.observer.flush() if pick.observer is not None else b""
        if pick.rename is not None:
            out = pick.rename.feed(out) + pick.rename.finish()
        return out

    def finish(self, pick: Pick, outcome: Outcome) -> None:
        """The request ended: release its load, record its metrics and access-log line, and let the
        key's budget and the estimator learn from the engine's usage."""
        gw = self._gw
        ex = pick.ex
        gw.capacity.release(pick.backend)
        if outcome == "success" and pick.observer is None and pick.answer:
            ex.usage = _usage(pick.protocol, b"".join(pick.answer))
        ex.outcome = outcome
        if outcome == "success":
            self._passive.success(pick.backend)
        gw.accounting.finish(ex)
        usage = ex.reported_usage()
        gw.access.account(pick.client, usage, ex.prompt_estimate, ex.streamed_tokens, pick.held)
        if outcome == "success" and usage is not None and pick.count is not NO_PROMPT:
            gw.caps.learn(pick.count, prompt_tokens(usage))
        if pick.ticket is not None:
            gw.admission.settle(ex.pool, pick.ticket, usage)


@dataclass
class _Progress:
    """What a pick has taken so far, for the refusal path to give back."""

    client: ClientKey | None = None
    held: BudgetHold | None = None


def _outcome_for(err: GatewayError, status: int) -> Outcome:
    """A refusal's outcome, as `gateway serve` counts it."""
    if isinstance(err, RateLimited):
        return "rejected_4xx"  # the client's own quota, not the gateway's capacity
    if isinstance(err, Overloaded | NoHealthyBackend) or status in (429, 529):
        return "overloaded"
    return "rejected_4xx" if status < 500 else "upstream_error_before_first_byte"


def _usage(protocol: ProtocolAdapter, raw: bytes) -> dict[str, Any] | None:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return protocol.usage(parsed) if isinstance(parsed, dict) else None
