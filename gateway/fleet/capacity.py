"""Capacity: in-flight counts per backend and in all, the bounded FIFO queue for a free slot, and
the retry budget (docs/reliability.md item 19: 20 % of in-flight requests, floor 3) that stops
retry storms."""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.config import RetryConfig
from gateway.fleet.registry import Backend, Registry


class Capacity:
    def __init__(self, registry: Registry, retry: RetryConfig) -> None:
        self._registry = registry
        self._retry = retry
        self.total_in_flight = 0
        self.retries_in_flight = 0
        self.queued = 0
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}

    def acquire(self, backend: Backend) -> None:
        backend.in_flight += 1
        self.total_in_flight += 1

    def release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self.total_in_flight -= 1
        self._registry.drop_if_idle(backend)
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
        self._waiters.setdefault(pool, deque()).append(waiter)
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

    def try_take_retry(self) -> bool:
        retry = self._retry
        allowed = max(retry.budget_min, int(retry.budget_ratio * self.total_in_flight))
        if self.retries_in_flight >= allowed:
            return False
        self.retries_in_flight += 1
        return True

    def give_back_retry(self) -> None:
        self.retries_in_flight -= 1
