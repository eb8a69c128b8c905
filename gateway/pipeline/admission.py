"""Admission: the backends a planned request may try now, or a wait in the bounded FIFO queue for a
slot when every healthy one is at its max_in_flight (the queue itself is fleet/capacity.py's)."""

from __future__ import annotations

import time
from dataclasses import replace

from gateway.config import LimitsConfig
from gateway.errors import NoHealthyBackend, Overloaded
from gateway.fleet.capacity import Capacity
from gateway.fleet.registry import Backend
from gateway.metrics import GatewayMetrics
from gateway.pipeline.router import Plan, Router


class Admission:
    def __init__(self, capacity: Capacity, router: Router, limits: LimitsConfig, metrics: GatewayMetrics) -> None:
        self._capacity = capacity
        self._router = router
        self._limits = limits
        self._metrics = metrics

    async def admit(self, plan: Plan, route: str) -> tuple[list[Backend], Plan]:
        """The backends to try (and the plan, re-ordered after a wait); when every one is full,
        wait in the bounded queue for a slot. Overloaded or NoHealthyBackend when there is none."""
        started = time.perf_counter()
        backends = plan.backends
        deadline = started + self._limits.queue_timeout_s
        saturated = plan.saturated
        while not backends and saturated and plan.key is not None:
            left = deadline - time.perf_counter()
            if not await self._capacity.wait_for_slot(plan.pool, left, self._limits.max_queue):
                raise Overloaded(f"Every backend of pool '{plan.pool}' is at its concurrency limit.", retry_after=1)
            backends, saturated, home = self._router.order(plan.pool, plan.key, only=plan.only)
            plan = replace(plan, backends=backends, saturated=saturated, home=home)
        if not backends:
            raise NoHealthyBackend(f"No healthy backend can serve route '{route}'.", retry_after=5)
        self._metrics.child(self._metrics.queue_wait, route, plan.pool).observe(time.perf_counter() - started)
        return backends, plan
