"""Admission: the backends a planned request may try now, or a wait in the bounded queue for a
slot when every healthy one is at its max_in_flight (the queue is fleet/capacity.py's, its order
policy/fairqueue.py's). While anyone waits for a pool, a newcomer queues too, so that a free slot
goes to whom the queue says, not to whoever asked last."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.access.keys import ClientKey
from gateway.access.limiter import tokens_of
from gateway.config import LimitsConfig, SharingConfig
from gateway.errors import NoHealthyBackend, Overloaded
from gateway.fleet.capacity import Capacity
from gateway.fleet.registry import Backend
from gateway.metrics import GatewayMetrics
from gateway.pipeline.context import Plan, Request
from gateway.pipeline.router import Router
from gateway.policy.fairqueue import Place, Ticket
from gateway.policy.priority import CLASSES, PRIORITY_HEADER, request_rank

ANONYMOUS = "anonymous"
"""The one flow (and key label) every request without a client key shares."""


class Admission:
    def __init__(
        self,
        capacity: Capacity,
        router: Router,
        limits: LimitsConfig,
        metrics: GatewayMetrics,
        sharing: SharingConfig | None = None,
    ) -> None:
        self._capacity = capacity
        self._router = router
        self._limits = limits
        self._metrics = metrics
        sharing = sharing or SharingConfig()
        self._output_estimate = sharing.output_estimate_tokens
        self._held_back = tuple(sharing.held_back(r) for r in range(len(CLASSES)))

    def ticket(self, client: ClientKey | None, request: Request, prompt: int) -> Ticket:
        """The request's class, flow, weight and estimated tokens, for the queue."""
        route = request.route
        header = request.headers.get(PRIORITY_HEADER)
        cost = float(max(0, prompt) + self.output_tokens(request.inbound.max_tokens))
        if client is None:
            return Ticket(request_rank(None, None, route.priority, header), ANONYMOUS, 1.0, max(cost, 1.0))
        rank = request_rank(client.priority, client.max_priority, route.priority, header)
        return Ticket(rank, client.name, client.weight, max(cost, 1.0))

    def output_tokens(self, max_tokens: int | None) -> int:
        """A request's output tokens, estimated: its max_tokens, else sharing.output_estimate_tokens."""
        return max_tokens if max_tokens is not None else self._output_estimate

    async def admit(self, plan: Plan, route: str, ticket: Ticket) -> tuple[list[Backend], Plan, bool]:
        """The backends to try (and the plan, re-ordered after a wait), and whether it queued; when
        every one is full, or others already wait, wait in the queue for a slot. Overloaded or
        NoHealthyBackend when there is none."""
        started = time.perf_counter()
        backends = plan.backends
        deadline = started + self._limits.queue_timeout_s
        saturated = plan.saturated
        capacity = self._capacity
        queued = False
        place: Place | None = None
        kick = False
        held = self._held_back[ticket.rank]
        if held and backends and plan.key is not None:  # the slots kept for higher classes: full for it
            backends = [b for b in backends if b.has_room(held)]
            saturated = saturated or not backends
        if plan.key is not None and backends and capacity.waiting(plan.pool):
            # Others wait for this pool: join the queue, and hand the free slot to whom it picks.
            saturated, backends, kick = True, [], True
        while not backends and saturated and plan.key is not None:
            queued = True
            left = deadline - time.perf_counter()
            outcome, place = await capacity.wait_for_slot(
                plan.pool, left, self._limits.max_queue, ticket, place, kick=kick
            )
            kick = False
            if outcome != "slot":
                self._metrics.child(self._metrics.shed, plan.pool, CLASSES[ticket.rank], outcome).inc()
                raise Overloaded(_refusal(plan.pool, outcome, CLASSES[ticket.rank]), retry_after=1)
            backends, saturated, home = self._router.order(plan.pool, plan.key, only=plan.only, held_back=held)
            plan = replace(plan, backends=backends, saturated=saturated, home=home)
        if not backends:
            raise NoHealthyBackend(f"No healthy backend can serve route '{route}'.", retry_after=5)
        waited = time.perf_counter() - started
        self._metrics.child(self._metrics.queue_wait, route, plan.pool).observe(waited)
        wait = self._metrics.class_queue_wait
        self._metrics.child(wait, plan.pool, CLASSES[ticket.rank], ticket.flow).observe(waited)
        return backends, plan, queued

    def settle(self, pool: str, ticket: Ticket, usage: Mapping[str, Any] | None) -> None:
        """A request that queued has ended: correct its key's fair share by the tokens it used."""
        if usage is not None:
            self._capacity.settle(pool, ticket, float(tokens_of(dict(usage), int(ticket.cost))))


def _refusal(pool: str, outcome: str, priority: str) -> str:
    if outcome == "shed":
        return f"Pool '{pool}' is saturated: this {priority} request was shed for a higher class."
    if outcome == "full":
        return f"Pool '{pool}' is saturated and its queue is full."
    return f"Every backend of pool '{pool}' is at its concurrency limit."
