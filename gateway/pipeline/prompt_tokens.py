"""A prompt's token ids as the engine will see them (chat template included), for matching against
the engines' KV events. The ids come from the engine's own tokenize call (vLLM's and SGLang's POST
/tokenize answer them), asked of the route's `kv_events` backends in turn, and are remembered
(TokenMemo) by the chained hash of the messages. So a request is matched from, in order:

- its own ids, remembered (the same conversation state asked again): no round trip;
- the ids of its longest remembered leading run of messages (a conversation's earlier turn), which
  are a prefix of its own up to the last message boundary, and all an engine can hold of it from
  earlier requests; its own ids are then asked for in the background, for the next turn;
- else its own ids, asked for before routing: one round trip (a conversation's first turn).

A character estimate cannot stand in (it has no ids), so when the engine can't answer, the request
is routed without a cache match (the balancer's hash)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gateway.config import GatewayConfig, RouteConfig
from gateway.errors import GatewayError
from gateway.fleet.registry import Backend, Registry
from gateway.metrics import GatewayMetrics
from gateway.pipeline.token_memo import TokenMemo, message_keys, prompt_key
from gateway.upstream.client import UpstreamClient

log = logging.getLogger(__name__)

BACKGROUND_CALLS: Final = 4
"""Background tokenize calls in flight at most; past it a request's own ids are not learned (its
next turn then matches from an earlier one, or asks before routing)."""


class PromptTokens:
    def __init__(
        self,
        config: GatewayConfig,
        registry: Registry,
        upstream: UpstreamClient,
        streaming: set[str],
        metrics: GatewayMetrics,
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._metrics = metrics
        self._timeout_s = config.timeouts.first_byte_s
        self._pools = frozenset(name for name, p in config.pools.items() if p.balancer == "kv_events")
        self._streaming = streaming
        """Backends whose KV events the gateway follows."""
        self.memo = TokenMemo()
        self._turn = itertools.count()
        self._asking: dict[bytes, asyncio.Future[list[int] | None]] = {}
        """Tokenize calls in flight by the prompt's key: a second request for the same prompt waits
        for the first call's answer instead of making its own."""
        self._background: set[asyncio.Task[Any]] = set()

    def wanted(self, route: RouteConfig) -> bool:
        return any(pool in self._pools for pool in route.pools)

    async def ids(self, route: RouteConfig, model: str, view: Mapping[str, Any] | None) -> Sequence[int] | None:
        if view is None:
            return None
        messages = view.get("messages") if isinstance(view.get("messages"), list) else None
        prompt = view.get("prompt") if isinstance(view.get("prompt"), str) else None
        if messages is not None:
            keys = message_keys(model, messages)
            if not keys:
                return None
        elif prompt is not None:
            keys = [prompt_key(model, prompt)]
        else:
            return None
        own = self.memo.get(keys[-1])
        if own is not None:
            self._count("remembered")
            return own
        earlier = self.memo.longest(keys[:-1])
        if earlier is not None:
            self._count("prefix")
            if len(self._background) < BACKGROUND_CALLS and keys[-1] not in self._asking:
                task = asyncio.create_task(self._ask(route, model, messages, prompt, keys[-1]))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            return earlier
        self._count("asked")
        return await self._ask(route, model, messages, prompt, keys[-1])

    def _count(self, source: str) -> None:
        self._metrics.child(self._metrics.kv_prompt_ids, source).inc()

    async def _ask(
        self,
        route: RouteConfig,
        model: str,
        messages: list[Any] | None,
        prompt: str | None,
        key: bytes,
    ) -> list[int] | None:
        waiting = self._asking.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        future: asyncio.Future[list[int] | None] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        tokens: list[int] | None = None
        try:
            tokens = await self._call(route, model, messages, prompt)
            if tokens is not None:
                self.memo.put(key, tokens)
        finally:
            del self._asking[key]
            future.set_result(tokens)
        return tokens

    def _backend(self, route: RouteConfig) -> Backend | None:
        """The next of the route's event-streaming backends, in turn: no one engine answers every
        gateway's tokenize calls."""
        backends = [
            b
            for pool in route.pools
            if pool in self._pools
            for b in self._registry.pools.get(pool, ())
            if b.healthy and not b.retired and b.name in self._streaming
        ]
        return backends[next(self._turn) % len(backends)] if backends else None

    async def _call(
        self, route: RouteConfig, model: str, messages: list[Any] | None, prompt: str | None
    ) -> list[int] | None:
        backend = self._backend(route)
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

    async def close(self) -> None:
        """Cancel the background calls (the gateway is stopping)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
