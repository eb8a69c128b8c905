"""The engines' own token ids for a prompt (vLLM's and SGLang's POST /tokenize), for the kv_events
match: asked of a route's event-streaming backends in turn, so that no one engine answers every
gateway's calls, or of one with nothing in flight when the call only checks the pool's tokenizer."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from typing import Any, Final

from gateway.config import GatewayConfig, RouteConfig
from gateway.errors import GatewayError
from gateway.fleet.registry import Backend, Registry
from gateway.upstream.client import UpstreamClient
from gateway.value import value

log = logging.getLogger(__name__)

CHECK_POLL_S: Final = 0.25
CHECK_WAIT_S: Final = 10.0
"""A check or a verification waits for a quiet moment: one of the pool's event-streaming backends
with nothing in flight from this gateway (looked for every CHECK_POLL_S; a check asks that one),
or CHECK_WAIT_S, whichever comes first. A gateway's first prompts come in its first burst, and
checked then they slowed it: a check's tokenize call is a template render and an encode on an
engine's API server that is taking the burst in (a request that misses an engine step waits a
whole step), and a verification's encode in the worker thread takes the GIL and a core from the
requests. Both only guard routing quality (ids that disagree match nothing), so they can wait."""


@value
class Asked:
    """A prompt whose ids are wanted: the route and model it came for, and its text."""

    route: RouteConfig
    model: str
    view: Mapping[str, Any]
    messages: list[Any] | None
    prompt: str | None
    key: int
    """Its memo key."""


class EngineTokens:
    """Tokenize calls to the pools' event-streaming backends."""

    def __init__(
        self, config: GatewayConfig, registry: Registry, upstream: UpstreamClient, streaming: set[str]
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._timeout_s = config.timeouts.first_byte_s
        self._pools = frozenset(name for name, p in config.pools.items() if p.balancer == "kv_events")
        self._streaming = streaming
        """Backends whose KV events the gateway follows."""
        self._turn = itertools.count()

    def wanted(self, route: RouteConfig) -> bool:
        return any(pool in self._pools for pool in route.pools)

    def backends(self, route: RouteConfig) -> list[Backend]:
        """The route's healthy event-streaming backends."""
        return [
            b
            for pool in route.pools
            if pool in self._pools
            for b in self._registry.pools.get(pool, ())
            if b.healthy and not b.retired and b.name in self._streaming
        ]

    def next(self, route: RouteConfig) -> Backend | None:
        """The next of the route's event-streaming backends, in turn: no one engine answers every
        gateway's tokenize calls."""
        backends = self.backends(route)
        return backends[next(self._turn) % len(backends)] if backends else None

    async def quiet(self, route: RouteConfig) -> Backend | None:
        """One of the route's event-streaming backends with nothing in flight from this gateway,
        waited for (CHECK_WAIT_S); then the least loaded (None: none is healthy)."""
        deadline = asyncio.get_running_loop().time() + CHECK_WAIT_S
        while True:
            # Looked for after a pause, not at once: when the check was started by a burst's first
            # requests, the backends the rest of that burst is about to take look idle.
            await asyncio.sleep(CHECK_POLL_S)
            backends = self.backends(route)
            idle = [b for b in backends if b.in_flight + b.decided == 0]
            if idle:
                return idle[next(self._turn) % len(idle)]
            if asyncio.get_running_loop().time() >= deadline:
                return min(backends, key=lambda b: b.in_flight + b.decided, default=None)

    async def call(self, asked: Asked, backend: Backend | None = None) -> list[int] | None:
        """The engine's ids for the prompt: of `backend`, else of the route's event-streaming
        backends in turn."""
        backend = backend or self.next(asked.route)
        if backend is None:
            return None
        name = backend.model or (backend.names[0] if backend.names else asked.model)
        calls = list(backend.adapter.tokenize_calls(name, asked.messages, asked.prompt))
        if len(calls) != 1:  # an engine that tokenizes in two steps (llama.cpp) publishes no KV events
            return None
        call = calls[0]
        try:
            status, data = await self._upstream.post_json(
                backend.url + call.path, dict(call.json), backend.auth_headers(), self._timeout_s, backend.name
            )
        except GatewayError as exc:
            log.debug("token ids from %s failed: %s", backend.name, exc.message)
            return None
        tokens = data.get("tokens") if status == 200 and isinstance(data, Mapping) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens
