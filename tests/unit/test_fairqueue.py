"""The queue's order, with no server: classes first, a minimum share for every waiting class, fair
share by weight on tokens inside a class, shedding from the bottom, and the priority a request gets."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from gateway.config import SharingConfig
from gateway.config_loader import parse_config
from gateway.fleet.registry import Registry
from gateway.policy.fairqueue import FairQueue, Ticket
from gateway.policy.priority import request_rank

pytestmark = pytest.mark.unit

INTERACTIVE, DEFAULT, BATCH = 0, 1, 2


def drain(queue: FairQueue, owners: dict[int, str], n: int) -> list[str]:
    served = []
    for _ in range(n):
        id_ = queue.pop()
        assert id_ is not None
        served.append(owners[id_])
    return served


def test_higher_class_first_whatever_the_arrival_order() -> None:
    queue = FairQueue(3, min_share=0.05)
    owners = {queue.push(Ticket(BATCH, "b", 1, 100)).id: f"batch-{i}" for i in range(3)}
    owners[queue.push(Ticket(INTERACTIVE, "i", 1, 100)).id] = "interactive"
    owners[queue.push(Ticket(DEFAULT, "d", 1, 100)).id] = "default"
    assert drain(queue, owners, 3) == ["interactive", "default", "batch-0"]


def test_a_waiting_lower_class_gets_its_minimum_share() -> None:
    """An endless interactive backlog: batch is still served once every 1/min_share dispatches."""
    queue = FairQueue(3, min_share=0.1)
    owners = {queue.push(Ticket(BATCH, "b", 1, 10)).id: "batch" for _ in range(50)}
    served = []
    for _ in range(200):
        owners[queue.push(Ticket(INTERACTIVE, "i", 1, 10)).id] = "interactive"
        id_ = queue.pop()
        assert id_ is not None
        served.append(owners[id_])
    assert served.count("batch") == 20
    gaps = [i for i, who in enumerate(served) if who == "batch"]
    assert max(b - a for a, b in zip([-1, *gaps], gaps, strict=False)) <= 10


def test_no_credit_is_banked_while_a_class_is_idle() -> None:
    queue = FairQueue(3, min_share=0.5)
    owners = {queue.push(Ticket(BATCH, "b", 1, 10)).id: "batch"}
    for _ in range(4):
        owners[queue.push(Ticket(INTERACTIVE, "i", 1, 10)).id] = "interactive"
    assert drain(queue, owners, 2) == ["interactive", "batch"]  # credit 0.5, then 1.0: served
    assert drain(queue, owners, 3) == ["interactive"] * 3
    owners.update({queue.push(Ticket(BATCH, "b", 1, 10)).id: "batch" for _ in range(2)})
    for _ in range(4):
        owners[queue.push(Ticket(INTERACTIVE, "i", 1, 10)).id] = "interactive"
    assert drain(queue, owners, 2) == ["interactive", "batch"]  # starts from no credit again


def shares(weights: dict[str, float], costs: dict[str, float], dispatches: int) -> dict[str, float]:
    """Every flow keeps a backlog of 20; the tokens served per flow, as fractions."""
    queue = FairQueue(3, min_share=0.05)
    owners: dict[int, str] = {}
    for flow in weights:
        for _ in range(20):
            owners[queue.push(Ticket(DEFAULT, flow, weights[flow], costs[flow])).id] = flow
    tokens: dict[str, float] = dict.fromkeys(weights, 0.0)
    for _ in range(dispatches):
        id_ = queue.pop()
        assert id_ is not None
        flow = owners.pop(id_)
        tokens[flow] += costs[flow]
        owners[queue.push(Ticket(DEFAULT, flow, weights[flow], costs[flow])).id] = flow
    total = sum(tokens.values())
    return {flow: tokens[flow] / total for flow in weights}


@pytest.mark.parametrize(
    ("weights", "costs", "expected"),
    [
        ({"a": 1, "b": 1}, {"a": 100, "b": 100}, {"a": 0.5, "b": 0.5}),
        ({"a": 2, "b": 1}, {"a": 100, "b": 100}, {"a": 2 / 3, "b": 1 / 3}),
        # b's requests are 4x larger: it gets a quarter of the dispatches, the same tokens.
        ({"a": 1, "b": 1}, {"a": 100, "b": 400}, {"a": 0.5, "b": 0.5}),
        ({"a": 1, "b": 1, "c": 2}, {"a": 50, "b": 50, "c": 50}, {"a": 0.25, "b": 0.25, "c": 0.5}),
    ],
)
def test_tokens_are_shared_by_weight_not_by_rate(
    weights: dict[str, float], costs: dict[str, float], expected: dict[str, float]
) -> None:
    got = shares(weights, costs, 600)
    for flow, share in expected.items():
        assert got[flow] == pytest.approx(share, abs=0.02)


def test_real_usage_corrects_the_estimate() -> None:
    """a's requests are estimated at 100 tokens but use 300: after the correction, b is served
    three times as often, so the tokens really used stay equal."""
    queue = FairQueue(3, min_share=0.05)
    owners: dict[int, str] = {}
    for flow in "ab":
        for _ in range(10):
            owners[queue.push(Ticket(DEFAULT, flow, 1, 100)).id] = flow
    used: Counter[str] = Counter()
    for _ in range(400):
        id_ = queue.pop()
        assert id_ is not None
        flow = owners.pop(id_)
        real = 300 if flow == "a" else 100
        queue.settle(Ticket(DEFAULT, flow, 1, 100), real)
        used[flow] += real
        owners[queue.push(Ticket(DEFAULT, flow, 1, 100)).id] = flow
    assert used["a"] / (used["a"] + used["b"]) == pytest.approx(0.5, abs=0.05)


def test_a_flow_that_was_idle_starts_level_not_ahead() -> None:
    """A key that sent nothing for a while gets no burst of banked share on its return."""
    queue = FairQueue(3, min_share=0.05)
    owners = {queue.push(Ticket(DEFAULT, "a", 1, 10)).id: "a" for _ in range(30)}
    drain(queue, owners, 20)
    owners.update({queue.push(Ticket(DEFAULT, "b", 1, 10)).id: "b" for _ in range(30)})
    assert Counter(drain(queue, owners, 20)) == {"a": 10, "b": 10}


def test_requeue_keeps_the_place_and_charges_once() -> None:
    queue = FairQueue(3, min_share=0.05)
    first = queue.push(Ticket(DEFAULT, "a", 1, 10))
    later = queue.push(Ticket(DEFAULT, "b", 1, 10))
    assert queue.pop() == first.id
    again = queue.requeue(first)  # woken, but another request took the slot
    assert queue.pop() == again.id
    assert queue.pop() == later.id
    assert queue.pop() is None


def test_victim_is_the_lowest_class_served_last() -> None:
    queue = FairQueue(3, min_share=0.05)
    queue.push(Ticket(DEFAULT, "d", 1, 10))
    queue.push(Ticket(BATCH, "b", 1, 10))
    last = queue.push(Ticket(BATCH, "b", 1, 10))
    victim = queue.victim(INTERACTIVE)
    assert victim is not None and victim.id == last.id
    assert queue.victim(BATCH) is None  # nothing lower than batch
    assert queue.remove(last.id) and len(queue) == 2
    assert not queue.remove(last.id)


def test_removed_requests_are_never_served() -> None:
    queue = FairQueue(3, min_share=0.05)
    gone = queue.push(Ticket(DEFAULT, "a", 1, 10))
    kept = queue.push(Ticket(DEFAULT, "a", 1, 10))
    queue.remove(gone.id)
    assert queue.pop() == kept.id
    assert queue.pop() is None


@pytest.mark.parametrize(
    ("key", "ceiling", "route", "header", "rank"),
    [
        (None, None, None, None, DEFAULT),
        ("interactive", None, None, None, INTERACTIVE),
        (None, None, "batch", None, BATCH),
        ("interactive", None, "batch", None, BATCH),  # the lower of key and route
        ("batch", None, None, "interactive", BATCH),  # no raising past the key's own class
        ("batch", "interactive", None, "interactive", INTERACTIVE),  # up to max_priority
        ("batch", "default", None, "interactive", DEFAULT),  # clipped at max_priority
        ("interactive", None, None, "batch", BATCH),  # lowering is always allowed
        ("default", None, None, "urgent", DEFAULT),  # an unknown class is ignored
        (None, None, None, " Interactive ", DEFAULT),  # no key: the header may only lower
    ],
)
def test_request_rank(key: str | None, ceiling: str | None, route: str | None, header: str | None, rank: int) -> None:
    assert request_rank(key, ceiling, route, header) == rank  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reserved", "expected"),
    [({}, (0, 0, 0)), ({"interactive": 1}, (0, 1, 1)), ({"interactive": 2, "default": 1}, (0, 2, 3))],
)
def test_slots_held_back_by_class(reserved: dict[str, int], expected: tuple[int, int, int]) -> None:
    sharing = SharingConfig.model_validate({"reserved": reserved})
    assert tuple(sharing.held_back(rank) for rank in (INTERACTIVE, DEFAULT, BATCH)) == expected


def _backends() -> Registry:
    backends = [{"url": "http://127.0.0.1:9", "max_in_flight": 4}, {"url": "http://127.0.0.1:10"}]
    data = {"pools": {"p": {"engine": "vllm", "backends": backends}}, "routes": [{"model": "m", "pools": ["p"]}]}
    return Registry(parse_config(data, env={}))


def test_a_backend_with_held_slots_is_full_early_but_keeps_its_last_slot() -> None:
    registry = _backends()
    backend = registry.by_name["p-0"]
    backend.in_flight = 3
    assert backend.has_room() and not backend.has_room(1)
    backend.in_flight = 0
    assert backend.has_room(4) and backend.has_room(9)  # the last slot is never held back
    backend.in_flight = 1
    assert not backend.has_room(4)
    unlimited = registry.by_name["p-1"]
    unlimited.in_flight = 10**6
    assert unlimited.has_room(5)


def test_batch_cannot_reserve_slots() -> None:
    with pytest.raises(ValidationError, match="batch"):
        SharingConfig.model_validate({"reserved": {"batch": 1}})
