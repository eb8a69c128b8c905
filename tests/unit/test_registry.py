"""The fleet: active checks need `failed_checks` failures in a row, passive ejection needs
`unhealthy_after`, the retry budget is 20 % of in-flight with a floor, DNS discovery keeps busy
members until their requests end, and slow start ramps a returning backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.config import GatewayConfig
from gateway.config_loader import parse_config
from gateway.fleet.capacity import Capacity
from gateway.fleet.discovery import apply_discovery
from gateway.fleet.health import HealthState
from gateway.fleet.registry import Backend, Discovered, Registry

pytestmark = pytest.mark.unit


class Fleet:
    """A registry with its capacity and health state, as create_app wires them."""

    def __init__(self, config: GatewayConfig) -> None:
        self.registry = reg = Registry(config)
        self.capacity = Capacity(reg, config.retry)
        self.health = HealthState(config.health)
        self.by_name, self.pools, self.discovered = reg.by_name, reg.pools, reg.discovered
        self.candidates, self.pool_available = reg.candidates, reg.pool_available
        self.record_check, self.record_failure = self.health.record_check, self.health.record_failure
        self.record_success = self.health.record_success
        self.acquire, self.release = self.capacity.acquire, self.capacity.release
        self.try_take_retry, self.give_back_retry = self.capacity.try_take_retry, self.capacity.give_back_retry

    def apply_discovery(self, entry: Discovered, addresses: list[str]) -> tuple[list[Backend], list[Backend]]:
        return apply_discovery(self.registry, entry, addresses)

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.registry)


def registry(**health: object) -> Fleet:
    return Fleet(
        parse_config(
            {
                "pools": {
                    "p": {"engine": "vllm", "backends": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}]}
                },
                "routes": [{"model": "m", "pools": ["p"]}],
                "health": health,
                "retry": {"budget_min": 3, "budget_ratio": 0.2},
            },
            env={},
        )
    )


def test_one_slow_health_check_does_not_eject() -> None:
    reg = registry(failed_checks=2)
    b = reg.by_name["p-0"]
    reg.record_check(b, False)
    assert not b.healthy  # at start-up one result decides
    reg.record_check(b, True)
    assert b.healthy
    reg.record_check(b, False)
    assert b.healthy and reg.pool_available("p")
    reg.record_check(b, False)
    assert not b.healthy


def test_passive_ejection_after_consecutive_failures() -> None:
    reg = registry(unhealthy_after=3)
    b = reg.by_name["p-0"]
    reg.record_check(b, True)
    assert not reg.record_failure(b) and not reg.record_failure(b)
    reg.record_success(b)  # a success resets the count
    assert not reg.record_failure(b) and not reg.record_failure(b)
    assert reg.record_failure(b) and not b.healthy


def test_retry_budget_floor_and_ratio() -> None:
    reg = registry()
    taken = sum(reg.try_take_retry() for _ in range(10))
    assert taken == 3  # the floor
    for _ in range(3):
        reg.give_back_retry()
    b = reg.by_name["p-1"]
    for _ in range(50):
        reg.acquire(b)
    assert sum(reg.try_take_retry() for _ in range(20)) == 10  # 20 % of 50 in flight


def test_dns_discovery_adds_retires_and_drops_members() -> None:
    reg = Fleet(
        parse_config(
            {
                "pools": {
                    "p": {
                        "engine": "vllm",
                        "backends": [{"url": "http://engines.svc:8000/x", "discover": True, "api_key": "k"}],
                    }
                },
                "routes": [{"model": "m", "pools": ["p"]}],
            },
            env={},
        )
    )
    assert reg.pools["p"] == [] and len(reg.discovered) == 1
    entry = reg.discovered[0]
    added, removed = reg.apply_discovery(entry, ["10.0.0.1", "10.0.0.2", "fd00::3"])
    assert [b.name for b in added] == ["p-0-10.0.0.1", "p-0-10.0.0.2", "p-0-fd00--3"] and removed == []
    assert reg.by_name["p-0-fd00--3"].url == "http://[fd00::3]:8000/x"
    assert reg.by_name["p-0-10.0.0.1"].api_key == "k"
    busy = reg.by_name["p-0-10.0.0.2"]
    reg.acquire(busy)
    added, removed = reg.apply_discovery(entry, ["10.0.0.1"])
    assert added == [] and {b.name for b in removed} == {"p-0-10.0.0.2", "p-0-fd00--3"}
    assert "p-0-fd00--3" not in reg.by_name  # idle: gone at once
    assert busy.retired and "p-0-10.0.0.2" in reg.by_name  # busy: stays until its request ends
    for b in reg:
        reg.record_check(b, True)
    assert [c.name for c in reg.candidates("p", 0.0)] == ["p-0-10.0.0.1"]  # a retired member takes nothing new
    reg.release(busy)
    assert "p-0-10.0.0.2" not in reg.by_name
    added, _ = reg.apply_discovery(entry, ["10.0.0.1", "10.0.0.2"])  # it came back
    assert [b.name for b in added] == ["p-0-10.0.0.2"]


def test_a_readmitted_backend_ramps_up() -> None:
    """docs/reliability.md item 17: back from an outage, a backend gets a ramped share (slow start), not a full
    one at once; the first admission at start-up does not ramp."""
    from gateway.policy.balancer import BalanceKey, LeastLoad

    reg = registry(slow_start_s=30.0, failed_checks=1)
    a, b = reg.by_name["p-0"], reg.by_name["p-1"]
    reg.record_check(a, True, now=0.0)
    reg.record_check(b, True, now=0.0)
    assert [c.ramp for c in reg.candidates("p", 0.0)] == [1.0, 1.0]
    reg.record_check(b, False, now=10.0)
    reg.record_check(b, True, now=20.0)  # back
    for _ in range(3):
        reg.acquire(a)  # the healthy one is busier...
    first = LeastLoad().order(reg.candidates("p", 21.0), BalanceKey())[0].name
    assert first == "p-0"  # ...but the newcomer, just back, still looks busier (8 x (1 - 1/30))
    assert LeastLoad().order(reg.candidates("p", 50.0), BalanceKey())[0].name == "p-1"  # ramped up
