"""Backend state: active checks need `failed_checks` failures in a row, passive ejection needs
`unhealthy_after`, and the retry budget is 20 % of in-flight with a floor."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from gateway.registry import Registry

pytestmark = pytest.mark.unit


def registry(**health: object) -> Registry:
    return Registry(parse_config({
        "pools": {"p": {"engine": "vllm", "backends": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}]}},
        "routes": [{"model": "m", "pools": ["p"]}], "health": health, "retry": {"budget_min": 3, "budget_ratio": 0.2},
    }, env={}))


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
