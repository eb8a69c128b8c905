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
ABSENT: Final = frozenset({404, 405, 501})
"""Statuses that say the backend has no tokenize endpoint (an engine behind the gateway that is
not vLLM or SGLang, or a proxy in front of one that does not pass the path)."""
ABSENT_REST_S: Final = (60.0, 600.0)
"""A backend without the endpoint is not asked again for this long, doubled each time it still
answers so, up to the second figure: without a pause every prompt not remembered would be asked of
it again (up to BACKGROUND_CALLS at once), each a request the engine refuses."""
FAILED_REST_S: Final = (1.0, 30.0)
"""The same after a call that failed (no answer in time, a refused connection, a 5xx): the engine
is busy or restarting, so it rests briefly. A 4xx other than ABSENT is about that prompt (too long,
a template it refuses): the backend is asked again for the next one."""


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
        self._resting: dict[str, tuple[float, float]] = {}
        """Backend -> (not asked again before this loop time, the rest that ended there)."""

    def wanted(self, route: RouteConfig) -> bool:
        return not self._pools.isdisjoint(route.pools)

    def backends(self, route: RouteConfig) -> list[Backend]:
        """The route's healthy event-streaming backends, less those resting after a failed call."""
        resting = self._resting
        now = asyncio.get_running_loop().time() if resting else 0.0
        return [
            b
            for pool in route.pools
            if pool in self._pools
            for b in self._registry.pools.get(pool, ())
            if b.healthy and not b.retired and b.name in self._streaming and not _rests(resting, b.name, now)
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
            self._rest(backend.name, FAILED_REST_S, f"failed: {exc.message}")
            return None
        if status in ABSENT:
            self._rest(backend.name, ABSENT_REST_S, f"answered {status} to POST {call.path}", logging.WARNING)
            return None
        if status >= 500:
            self._rest(backend.name, FAILED_REST_S, f"answered {status}")
            return None
        self._resting.pop(backend.name, None)
        tokens = data.get("tokens") if status == 200 and isinstance(data, Mapping) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens

    def _rest(self, name: str, rests: tuple[float, float], why: str, level: int = logging.DEBUG) -> None:
        """`name` is not asked again for a while: the first of `rests`, doubled each time in a row,
        up to the second."""
        now = asyncio.get_running_loop().time()
        last = self._resting.get(name)
        if last is not None and last[0] > now:
            return  # a call that was already in flight when the rest began
        rest = min(rests[1], last[1] * 2) if last is not None else rests[0]
        self._resting[name] = (now + rest, rest)
        log.log(
            level if last is None else logging.DEBUG,
            "token ids from %s: %s; it is not asked for %g s (the pool's `tokenizer` encodes prompts in the "
            "gateway instead)",
            name,
            why,
            rest,
        )


def _rests(resting: Mapping[str, tuple[float, float]], name: str, now: float) -> bool:
    found = resting.get(name)
    return found is not None and found[0] > now
