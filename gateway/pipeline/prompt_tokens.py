"""A prompt's token ids as the engine will see them (chat template included), for matching against
the engines' KV events: asked from one healthy backend of the route's `kv_events` pools with the
engine's own tokenize call (vLLM's and SGLang's POST /tokenize answer the ids). One round trip
before routing, only on those pools; a character estimate cannot stand in (it has no ids), so when
the engine can't answer, the request is routed without a cache match (the balancer's hash)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gateway.config import GatewayConfig, RouteConfig
from gateway.errors import GatewayError
from gateway.fleet.registry import Registry
from gateway.upstream.client import UpstreamClient

log = logging.getLogger(__name__)


class PromptTokens:
    def __init__(
        self, config: GatewayConfig, registry: Registry, upstream: UpstreamClient, streaming: set[str]
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._timeout_s = config.timeouts.first_byte_s
        self._pools = frozenset(name for name, p in config.pools.items() if p.balancer == "kv_events")
        self._streaming = streaming
        """Backends whose KV events the gateway follows."""

    def wanted(self, route: RouteConfig) -> bool:
        return any(pool in self._pools for pool in route.pools)

    async def ids(self, route: RouteConfig, model: str, view: Mapping[str, Any] | None) -> list[int] | None:
        if view is None:
            return None
        messages = view.get("messages") if isinstance(view.get("messages"), list) else None
        prompt = view.get("prompt") if isinstance(view.get("prompt"), str) else None
        if messages is None and prompt is None:
            return None
        backend = next(
            (
                b
                for pool in route.pools
                if pool in self._pools
                for b in self._registry.pools.get(pool, ())
                if b.healthy and not b.retired and b.name in self._streaming
            ),
            None,
        )
        if backend is None:
            return None
        name = backend.model or (backend.names[0] if backend.names else model)
        calls = list(backend.adapter.tokenize_calls(name, messages, prompt))
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
