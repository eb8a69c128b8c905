"""Capacity: in-flight counts per backend and in all, the bounded queue for a free slot (served in
the order policy/fairqueue.py decides: classes, then fair share between keys), and the retry budget
(docs/reliability.md item 19: 20 % of in-flight requests, floor 3) that stops retry storms."""

from __future__ import annotations

import asyncio
from typing import Literal

from gateway.config import RetryConfig, SharingConfig
from gateway.fleet.registry import Backend, Registry
from gateway.policy.fairqueue import FairQueue, Place, Ticket
from gateway.policy.priority import CLASSES

Wait = Literal["slot", "full", "timeout", "shed"]
"""How a wait ended: woken for a slot, refused at once (queue full, nothing lower to shed), timed
out, or shed to make room for a higher class."""


class Capacity:
    def __init__(self, registry: Registry, retry: RetryConfig, sharing: SharingConfig | None = None) -> None:
        self._registry = registry
        self._retry = retry
        self._min_share = (sharing or SharingConfig()).min_share
        self.total_in_flight = 0
        self.retries_in_flight = 0
        self.queued = 0
        self._queues: dict[str, FairQueue] = {}
        self._waiters: dict[int, asyncio.Future[Wait]] = {}

    def acquire(self, backend: Backend) -> None:
        backend.in_flight += 1
        self.total_in_flight += 1

    def release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self.total_in_flight -= 1
        self._registry.drop_if_idle(backend)
        self.wake(backend.pool)

    def waiting(self, pool: str) -> int:
        queue = self._queues.get(pool)
        return len(queue) if queue is not None else 0

    def wake(self, pool: str) -> None:
        """Hand a slot of `pool` to the request the queue serves next, if any waits."""
        queue = self._queues.get(pool)
        if queue is None:
            return
        id_ = queue.pop()
        if id_ is not None:
            self._waiters.pop(id_).set_result("slot")

    def settle(self, pool: str, ticket: Ticket, used: float) -> None:
        queue = self._queues.get(pool)
        if queue is not None:
            queue.settle(ticket, used)

    async def wait_for_slot(
        self,
        pool: str,
        timeout_s: float,
        max_queue: int,
        ticket: Ticket,
        place: Place | None = None,
        *,
        kick: bool = False,
    ) -> tuple[Wait, Place | None]:
        """Queue until a backend of `pool` releases a slot and the queue picks this request. The
        caller re-plans: the slot is not reserved for it, and when someone else took it, it waits
        again with the place it is given back (`place`), not at the end. `kick`: a slot is free
        now; once queued, hand it to whom the queue picks (maybe this request)."""
        if timeout_s <= 0:
            return "timeout", None
        if self.queued >= max_queue and not self._shed_for(ticket.rank):
            return "full", None
        queue = self._queues.get(pool)
        if queue is None:
            queue = self._queues[pool] = FairQueue(len(CLASSES), self._min_share)
        mine = queue.push(ticket) if place is None else queue.requeue(place)
        waiter: asyncio.Future[Wait] = asyncio.get_running_loop().create_future()
        self._waiters[mine.id] = waiter
        self.queued += 1
        if kick:
            self.wake(pool)
        try:
            return await asyncio.wait_for(waiter, timeout_s), mine
        except TimeoutError:
            return "timeout", mine
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result() == "slot":
                self.wake(pool)  # the slot handed to this request must not be lost with it
            raise
        finally:
            self.queued -= 1
            if queue.remove(mine.id):  # still queued: it timed out or its request was cancelled
                self._waiters.pop(mine.id, None)

    def _shed_for(self, rank: int) -> bool:
        """Make room for a request of `rank` by shedding the queued request of the lowest class
        below it (the one that class would serve last), in any pool; False when none is lower."""
        found: tuple[int, str, Place] | None = None
        for pool, queue in self._queues.items():
            place = queue.victim(rank)
            if place is not None and (found is None or place.rank > found[0]):
                found = (place.rank, pool, place)
        if found is None:
            return False
        _, pool, place = found
        self._queues[pool].remove(place.id)
        self._waiters.pop(place.id).set_result("shed")
        return True

    def try_take_retry(self) -> bool:
        retry = self._retry
        allowed = max(retry.budget_min, int(retry.budget_ratio * self.total_in_flight))
        if self.retries_in_flight >= allowed:
            return False
        self.retries_in_flight += 1
        return True

    def give_back_retry(self) -> None:
        self.retries_in_flight -= 1
