"""The one gate the request path calls for client access: authenticate (before the body is read),
admit (model allowlist, then requests and tokens per minute), account (tokens, when a request
ends). It turns the limiter's decisions into the gateway's errors, which each protocol renders
in its own shape; it owns the counter store and what a failing store means (redis.fail_open)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.access.budget import HOLD_SLOT_S, Holds, Limits, hold_name, hold_names, refusal_of, used_names
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
    async def hold(
        self, holds: Holds, used: list[str], limits: list[Limits], amount: tuple[int, int], ttl_s: int
    ) -> tuple[int, int, int] | None: ...
    async def spend(
        self, holds: tuple[str, str], held: tuple[int, int], used: list[str], spent: tuple[int, int], ttls: list[int]
    ) -> list[tuple[int, int]]: ...
    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BudgetHold:
    """What a running request holds against its key's budgets, and where, to release at its end."""

    names: tuple[str, str]
    amount: tuple[int, int]


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

    async def hold(self, client: ClientKey | None, prompt: int, output: int) -> BudgetHold | None:
        """Hold a request's estimate (prompt, output budget) against its key's token budgets, or
        raise RateLimited (429, Retry-After until the reset) for a budget with nothing left. With
        the store unreachable: served unheld (fail_open) or NoHealthyBackend (503)."""
        if client is None or not client.budgets:
            return None
        now = time.time()
        slot, holds = hold_names(self._prefix, client.name, now)
        used = [name for b in client.budgets for name in used_names(self._prefix, client.name, b, now)[:2]]
        limits: list[Limits] = [(b.input_tokens, b.output_tokens) for b in client.budgets]
        amount = (max(0, prompt), max(0, output))
        try:
            found = await self._call_store(self._store.hold(holds, used, limits, amount, 2 * HOLD_SLOT_S))
        except StoreUnavailable:
            if self._fail_open:
                return None
            raise NoHealthyBackend(
                "The budget store is unavailable.", code="rate_limiter_unavailable", retry_after=1
            ) from None
        if found is not None:
            refused = refusal_of(client.budgets, found, now)
            self._metrics.rate_limited.labels(client.name, f"budget_{refused.budget.period}").inc()
            raise RateLimited(
                refused.message(now), limit="tokens", retry_after=refused.resets_at - now, code="budget_exceeded"
            )
        prefix, name = self._prefix, client.name
        return BudgetHold((hold_name(prefix, name, "input", slot), hold_name(prefix, name, "output", slot)), amount)

    def account(
        self,
        client: ClientKey | None,
        usage: Mapping[str, Any] | None,
        prompt: int,
        output: int,
        held: BudgetHold | None = None,
    ) -> None:
        """Count a finished request's tokens against its key, and release its budget hold (in the
        background: the request is done). `prompt` and `output`: the gateway's own counts, for a
        request whose engine reported no usage (0 when it never reached one)."""
        if client is None:
            return
        reported = dict(usage) if usage is not None else None
        if client.tokens_per_minute is not None:
            amount = tokens_of(reported, prompt + output)
            if amount > 0:
                _, tokens = counter_names(self._prefix, client, time.time())
                self._background(self._add(tokens, amount))
        if held is not None:
            spent = (_reported(reported, "prompt_tokens", prompt), _reported(reported, "completion_tokens", output))
            self._background(self._spend(client, held, spent))

    def _background(self, call: Any) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _spend(self, client: ClientKey, held: BudgetHold, spent: tuple[int, int]) -> None:
        now = time.time()
        used: list[str] = []
        ttls: list[int] = []
        for budget in client.budgets:
            name_in, name_out, period = used_names(self._prefix, client.name, budget, now)
            used += [name_in, name_out]
            ttls.append(int(period.resets_at - now) + 86_400)  # a day past its end, for `gateway keys`
        try:
            totals = await self._call_store(self._store.spend(held.names, held.amount, used, spent, ttls))
        except StoreUnavailable:
            return  # counted in _call_store; a lost count only loosens the budget
        for budget, (used_in, used_out) in zip(client.budgets, totals, strict=True):
            self._metrics.budget_used.labels(client.name, budget.period, "input").set(used_in)
            self._metrics.budget_used.labels(client.name, budget.period, "output").set(used_out)

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


def _reported(usage: dict[str, Any] | None, field: str, fallback: int) -> int:
    value = usage.get(field) if usage is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return max(0, fallback)
