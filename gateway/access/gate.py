"""The one gate the request path calls for client access: authenticate (before the body is read),
admit (model allowlist, then requests and tokens per minute), account (tokens, when a request
ends). It turns the limiter's decisions into the gateway's errors, which each protocol renders
in its own shape; it owns the counter store and what a failing store means (redis.fail_open)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from gateway.access.keys import ClientKey, KeyRing
from gateway.access.limiter import WINDOW_S, StoreUnavailable, counter_names, decide, tokens_of
from gateway.errors import ModelNotAllowed, NoHealthyBackend, RateLimited
from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

_RETRY_STORE_S = 1.0
"""After a store failure, requests skip the store for this long (no 0.25 s wait on each)."""
_TTL_S = 2 * WINDOW_S


class CounterStore(Protocol):
    async def hit(self, requests: str, tokens: str, count_request: bool, ttl_s: int) -> tuple[int, int]: ...
    async def add(self, tokens: str, amount: int, ttl_s: int) -> None: ...
    async def close(self) -> None: ...


class AccessGate:
    def __init__(
        self,
        keys: KeyRing,
        store: CounterStore,
        store_name: str,
        metrics: GatewayMetrics,
        *,
        fail_open: bool = True,
        prefix: str = "gateway:rl:",
    ) -> None:
        self._keys = keys
        self._store = store
        self._store_name = store_name
        self._metrics = metrics
        self._fail_open = fail_open
        self._prefix = prefix
        self._skip_store_until = 0.0
        self._pending: set[asyncio.Task[None]] = set()
        metrics.limiter_up.labels(store_name).set(1)

    @property
    def enabled(self) -> bool:
        return self._keys.enabled

    def authenticate(self, authorization: str | None, api_key: str | None = None) -> ClientKey | None:
        """The client key (a Bearer token or an x-api-key), None when client auth is off; raises
        Unauthorized (401)."""
        return self._keys.identify(authorization, api_key)

    async def admit(self, client: ClientKey | None, model: str) -> None:
        """Raise ModelNotAllowed (403), RateLimited (429) or, with fail_open false and the store
        unreachable, NoHealthyBackend (503); return when the request may go."""
        if client is None:
            return
        if not client.allows(model):
            raise ModelNotAllowed(f"This API key may not use the model '{model[:64]}'.", param="model")
        if not client.limited:
            return
        now = time.time()
        requests, tokens = counter_names(self._prefix, client, now)
        try:
            seen, used = await self._call_store(
                self._store.hit(requests, tokens, client.requests_per_minute is not None, _TTL_S)
            )
        except StoreUnavailable:
            if self._fail_open:
                return
            raise NoHealthyBackend(
                "The rate limiter is unavailable.", code="rate_limiter_unavailable", retry_after=1
            ) from None
        decision = decide(client, seen, used, now)
        if decision.allowed:
            return
        assert decision.limit is not None
        self._metrics.rate_limited.labels(client.name, decision.limit).inc()
        per = "requests per minute" if decision.limit == "requests" else "tokens per minute"
        raise RateLimited(
            f"Rate limit reached for this API key on {per}: limit {decision.cap}, used {decision.used}. "
            f"Try again in {max(1, round(decision.retry_after_s))} s.",
            limit=decision.limit,
            retry_after=decision.retry_after_s,
        )

    def account(self, client: ClientKey | None, usage: Mapping[str, Any] | None, estimate: int) -> None:
        """Count a finished request's tokens against its key (in the background: the request is done)."""
        if client is None or client.tokens_per_minute is None:
            return
        amount = tokens_of(dict(usage) if usage is not None else None, estimate)
        if amount <= 0:
            return
        _, tokens = counter_names(self._prefix, client, time.time())
        task = asyncio.get_running_loop().create_task(self._add(tokens, amount))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self._store.close()

    async def _add(self, tokens: str, amount: int) -> None:
        try:
            await self._call_store(self._store.add(tokens, amount, _TTL_S))
        except StoreUnavailable:
            return  # counted in _call_store; a lost count only loosens the limit

    async def _call_store(self, call: Any) -> Any:
        if time.monotonic() < self._skip_store_until:
            call.close()  # the coroutine is never awaited
            raise StoreUnavailable("backing off")
        try:
            result = await call
        except StoreUnavailable as exc:
            self._skip_store_until = time.monotonic() + _RETRY_STORE_S
            self._metrics.limiter_errors.labels(self._store_name).inc()
            self._metrics.limiter_up.labels(self._store_name).set(0)
            log.warning("rate-limit store %s failed (%s); %s", self._store_name, exc, self._policy())
            raise
        self._metrics.limiter_up.labels(self._store_name).set(1)
        return result

    def _policy(self) -> str:
        return "serving without limits (fail_open)" if self._fail_open else "refusing limited keys (fail_open: false)"
