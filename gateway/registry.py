"""The only owner of mutable backend state: health, in-flight counts, the last scraped load,
and the retry budget. Everything else reads snapshots of it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from engines.adapters import adapter_for
from engines.base import EngineAdapter, EngineLoad
from gateway.balancer import Candidate
from gateway.config import GatewayConfig, backend_name


@dataclass(eq=False)
class Backend:
    pool: str
    name: str
    engine: str
    url: str
    api_key: str | None
    model: str | None
    max_in_flight: int | None
    adapter: EngineAdapter
    healthy: bool = False
    checked: bool = False
    consecutive_failures: int = 0
    failed_checks: int = 0
    in_flight: int = 0
    load: EngineLoad | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def auth_headers(self) -> dict[str, str]:
        """The backend's own key, for every call the gateway makes to it."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def candidate(self, now: float, stale_s: float) -> Candidate:
        fresh = self.load is not None and now - self.load.scraped_at <= stale_s
        return Candidate(name=self.name, in_flight=self.in_flight, load=self.load, load_fresh=fresh,
                         max_in_flight=self.max_in_flight)


class Registry:
    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self.pools: dict[str, list[Backend]] = {}
        self.by_name: dict[str, Backend] = {}
        for pool_name, pool in config.pools.items():
            members = []
            # A simulator speaks one real engine's API exactly, so it is driven by that adapter.
            adapter = adapter_for(pool.flavour if pool.engine == "sim" else pool.engine)
            for i, b in enumerate(pool.backends):
                backend = Backend(
                    pool=pool_name, name=backend_name(pool_name, i, b), engine=pool.engine,
                    url=b.url.rstrip("/"), api_key=(b.api_key.get_secret_value() or None) if b.api_key else None,
                    model=b.model, max_in_flight=b.max_in_flight, adapter=adapter,
                )
                members.append(backend)
                self.by_name[backend.name] = backend
            self.pools[pool_name] = members
        self.total_in_flight = 0
        self.retries_in_flight = 0
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {name: deque() for name in self.pools}
        self.queued = 0

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.by_name.values())

    def pool_available(self, pool: str) -> bool:
        return any(b.healthy for b in self.pools.get(pool, ()))

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.by_name.values())

    def candidates(self, pool: str, now: float) -> list[Candidate]:
        stale = self._config.health.scrape_stale_s
        return [b.candidate(now, stale) for b in self.pools.get(pool, ()) if b.healthy]

    def has_capacity(self, backend: Backend) -> bool:
        return backend.max_in_flight is None or backend.in_flight < backend.max_in_flight

    def acquire(self, backend: Backend) -> None:
        backend.in_flight += 1
        self.total_in_flight += 1

    def release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self.total_in_flight -= 1
        self._wake(backend.pool)

    def _wake(self, pool: str) -> None:
        waiters = self._waiters.get(pool)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def wait_for_slot(self, pool: str, timeout_s: float, max_queue: int) -> bool:
        """Queue FIFO until a backend of `pool` releases a slot; False when the queue is full or
        the wait timed out. The caller re-plans: the slot is not reserved for it."""
        if self.queued >= max_queue or timeout_s <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[pool].append(waiter)
        self.queued += 1
        try:
            await asyncio.wait_for(waiter, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.queued -= 1
            if not waiter.done():
                waiter.cancel()

    # Passive health: connect errors and 5xx count; a 4xx is the client's fault, not the backend's.
    def record_failure(self, backend: Backend) -> bool:
        """Returns True when this failure ejected the backend."""
        backend.consecutive_failures += 1
        if backend.healthy and backend.consecutive_failures >= self._config.health.unhealthy_after:
            backend.healthy = False
            return True
        return False

    def record_success(self, backend: Backend) -> None:
        backend.consecutive_failures = 0

    def set_health(self, backend: Backend, healthy: bool) -> None:
        backend.checked = True
        if healthy and not backend.healthy:
            backend.consecutive_failures = 0
        backend.healthy = healthy

    def record_check(self, backend: Backend, ok: bool) -> None:
        """One active health check's result. A backend never checked before takes the result at once
        (start-up); a healthy one is marked down only after `failed_checks` failures in a row."""
        if ok:
            backend.failed_checks = 0
            self.set_health(backend, True)
            return
        backend.failed_checks += 1
        if not backend.checked or not backend.healthy or backend.failed_checks >= self._config.health.failed_checks:
            self.set_health(backend, False)

    def set_load(self, backend: Backend, load: EngineLoad) -> None:
        backend.load = load

    # The retry budget (RELIABILITY: 20 % of in-flight requests, floor 3) stops retry storms.
    def try_take_retry(self) -> bool:
        retry = self._config.retry
        allowed = max(retry.budget_min, int(retry.budget_ratio * self.total_in_flight))
        if self.retries_in_flight >= allowed:
            return False
        self.retries_in_flight += 1
        return True

    def give_back_retry(self) -> None:
        self.retries_in_flight -= 1
