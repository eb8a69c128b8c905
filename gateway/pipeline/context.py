"""The two values a request's stages share, besides `Exchange` (the one mutable record):

- `Request`: what the client asked, as read and resolved (the protocol, the parsed body, the route,
  the name after aliases, the prompt's view and its size, measured once). The planner, the caps and
  admission read it.
- `Plan`: the router's decision (pool, rule, the backends in the balancer's order).
- `Dispatch`: what the plan decided (the plan, each candidate backend with the model name it is
  sent, computed once, the edits, the upstream headers) and the client's side of the exchange (its
  `send`, and the owner the idle watch ends). The attempts and the relay read it.

Both are built by the endpoint and never changed after; a stage that learns something writes it
on the Exchange."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from gateway.asgi import Send
from gateway.config import RouteConfig
from gateway.fleet.registry import Backend
from gateway.policy.balancer import BalanceKey
from gateway.policy.caps import prompt_size
from gateway.policy.rules import RequestFacts
from gateway.protocols.base import Inbound, ProtocolAdapter
from gateway.protocols.edits import Edits
from gateway.value import value

EndReason = Literal["client_left", "idle_limit"]
"""Why the request's owner ended a request early (the drain deadline comes from the server)."""


class IdleEnd(Protocol):
    """What the idle watch may call: the request owner's end(reason)."""

    def end(self, reason: EndReason) -> None: ...


PromptSize = tuple[int, int, int, int]
"""(characters, messages, known-wide characters, wide characters) of a prompt's view (policy/caps.py)."""


@value
class Request:
    protocol: ProtocolAdapter
    """The route's adapter (a route may get a variant of the endpoint's)."""
    inbound: Inbound
    route: RouteConfig
    model: str
    """The model name after aliases (the client's own when it names no alias)."""
    headers: Mapping[str, str]
    """The client's headers, lower-case names."""
    view: Mapping[str, Any] | None
    """The prompt as the caps and the prefix rules read it; None: the request has no prompt."""
    size: PromptSize | None
    """`prompt_size(view)`, measured here once for every stage that sizes the prompt."""


def read(
    protocol: ProtocolAdapter, inbound: Inbound, route: RouteConfig, model: str, headers: Mapping[str, str]
) -> Request:
    """The Request for a parsed body on `route`: its view, and the view's size, computed once."""
    view = protocol.estimate_view(inbound)
    return Request(protocol, inbound, route, model, headers, view, prompt_size(view) if view is not None else None)


@value
class Plan:
    pool: str
    rule: str
    backends: list[Backend]
    facts: RequestFacts
    fingerprint: tuple[int, ...] = ()
    key: BalanceKey | None = None
    saturated: bool = False
    """Healthy backends exist, but every one is at its max_in_flight: the request may queue."""
    home: str | None = None
    """Where the balancer's memory says this conversation lives (explicit input to learn())."""
    model: str = ""
    """The model name after aliases ("" = the client's)."""
    only: tuple[str, ...] | None = None
    """The pool's backends that serve the model, when not all of them do."""
    wildcard: bool = False
    """The route is a glob: a name the chosen backend does not serve is rewritten to the one it does."""
    reserved: Backend | None = None
    """kv_events: the backend whose `decided` count this plan holds until its attempt starts."""
    explanation: str | None = None
    """The balancer's account of its choice (x-gateway-balancer), where it gives one."""


@value
class Candidate:
    """A backend to try, with the model name it is sent (None: the client's own)."""

    backend: Backend
    model: str | None


@value
class Dispatch:
    request: Request
    plan: Plan
    candidates: tuple[Candidate, ...]
    """The backends to try, in order, at most retry.max_attempts of them."""
    edits: Edits
    """The protocol's own edits, then the caps'."""
    headers: dict[str, str]
    """The headers sent upstream (pipeline/headers.py), before an attempt's trace context."""
    send: Send
    owner: IdleEnd
    """The request's owner: the idle watch ends the request through it."""
