"""The order in which queued requests get the slots that free up: priority classes, highest
first, with a minimum share for every class that waits (none starves); inside a class, start-time
fair queuing over the keys (flows) by weight, on each request's estimated tokens, corrected by the
tokens it really used. Pure: the caller holds the waiters, this holds only their tags."""

from __future__ import annotations

import heapq

from gateway.value import value


@value
class Ticket:
    """What the queue needs of one request."""

    rank: int
    """Its priority class, 0 = highest."""
    flow: str
    """Whom it shares with: the key's name, or one anonymous flow."""
    weight: float
    cost: float
    """Estimated tokens: prompt plus the most it may generate."""


@value
class Place:
    """A queued request's place: kept by a waiter woken too early, to queue again where it was."""

    id: int
    rank: int
    start: float


class FairQueue:
    """One pool's waiting requests. Every class keeps its own virtual time (the start tag of the
    request it served last) and each flow's finish tag; a request starts at the later of the two,
    and finishes cost / weight after, so a key's share of the tokens follows its weight whatever
    its rate. A class passed over while it waits earns `min_share` credit a dispatch and is served
    as soon as it holds a whole one: of every ceil(1 / min_share) + classes dispatches, each
    waiting class gets at least one."""

    def __init__(self, classes: int, min_share: float) -> None:
        self._heaps: list[list[tuple[float, int]]] = [[] for _ in range(classes)]
        self._virtual = [0.0] * classes
        self._finish: list[dict[str, float]] = [{} for _ in range(classes)]
        self._credit = [0.0] * classes
        self._live: dict[int, Place] = {}
        self._count = [0] * classes
        self._min_share = min_share
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._live)

    def push(self, ticket: Ticket) -> Place:
        """Queue a new request: it is charged its cost now."""
        c = min(max(ticket.rank, 0), len(self._heaps) - 1)
        finish = self._finish[c]
        start = max(self._virtual[c], finish.get(ticket.flow, 0.0))
        finish[ticket.flow] = start + ticket.cost / ticket.weight
        return self._insert(c, start)

    def requeue(self, place: Place) -> Place:
        """Queue again a request woken for a slot that someone else took: same class, same start
        tag, not charged twice."""
        return self._insert(place.rank, place.start, place.id)

    def pop(self) -> int | None:
        """The id of the request to serve next; None when nothing waits."""
        waiting = [c for c, n in enumerate(self._count) if n]
        if not waiting:
            return None
        chosen = waiting[0]
        for c in waiting[1:]:
            self._credit[c] += self._min_share
        owed = [c for c in waiting[1:] if self._credit[c] >= 1.0 - 1e-9]  # ten 0.1s must make one
        if owed:
            chosen = owed[0]
            self._credit[chosen] -= 1.0
        heap = self._heaps[chosen]
        while heap:
            start, id_ = heapq.heappop(heap)
            if id_ in self._live:
                del self._live[id_]
                self._virtual[chosen] = max(self._virtual[chosen], start)
                self._left(chosen)
                return id_
        raise AssertionError("a class counted as waiting had no live entry")

    def remove(self, id_: int) -> bool:
        """Take a request out (it timed out, left, or was shed); False when it was not queued."""
        place = self._live.pop(id_, None)
        if place is None:
            return False
        self._left(place.rank)
        heap = self._heaps[place.rank]
        if len(heap) > 2 * self._count[place.rank] + 64:  # drop the dead entries a long wait leaves
            self._heaps[place.rank] = [e for e in heap if e[1] in self._live]
            heapq.heapify(self._heaps[place.rank])
        return True

    def victim(self, below: int) -> Place | None:
        """The request to shed for one of rank `below`: from the lowest class under it that has
        any, the one that would be served last."""
        for c in range(len(self._heaps) - 1, below, -1):
            if self._count[c]:
                _, id_ = max((e for e in self._heaps[c] if e[1] in self._live), default=(0.0, -1))
                return self._live[id_]
        return None

    def settle(self, ticket: Ticket, used: float) -> None:
        """A request served from this queue ended having used `used` tokens: move its flow's finish
        tag by the difference from its estimate (never back past the class's virtual time)."""
        c = min(max(ticket.rank, 0), len(self._heaps) - 1)
        finish = self._finish[c]
        if ticket.flow in finish:
            moved = finish[ticket.flow] + (used - ticket.cost) / ticket.weight
            finish[ticket.flow] = max(self._virtual[c], moved)

    def _insert(self, c: int, start: float, id_: int = 0) -> Place:
        if not id_:
            self._next_id += 1
            id_ = self._next_id
        place = Place(id_, c, start)
        heapq.heappush(self._heaps[c], (start, place.id))
        self._live[place.id] = place
        self._count[c] += 1
        return place

    def _left(self, c: int) -> None:
        self._count[c] -= 1
        if not self._count[c]:
            # Nothing of this class waits: no credit is banked, and the flows start level again.
            self._credit[c] = 0.0
            self._heaps[c].clear()
            self._finish[c].clear()
