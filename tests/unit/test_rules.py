"""Route rules: every condition, first match wins, labels, and the fallback through the route's pools."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.config import RouteConfig, RuleConfig, RuleWhen
from gateway.policy.rules import Decision, RequestFacts, matches, ordered_fallbacks, rule_label, select_pool

pytestmark = pytest.mark.unit

POOLS = ("vllm", "sglang", "llamacpp")
ALL = frozenset(POOLS)
BASE = RequestFacts(
    model="llama-3-8b",
    stream=False,
    has_tools=False,
    headers={},
    prompt_tokens=500,
    shared_prefix=False,
    platform="nvidia_gpu",
)


def facts(**changes: Any) -> RequestFacts:
    return dataclasses.replace(BASE, **changes)


def route(*rules: RuleConfig, pools: tuple[str, ...] = POOLS) -> RouteConfig:
    return RouteConfig(model="llama-*", pools=pools, rules=rules)


def one_rule(**when: Any) -> RouteConfig:
    return route(RuleConfig(when=RuleWhen(**when), pool="sglang"))


# (condition, label, facts that match, facts that don't)
CONDITIONS: list[tuple[dict[str, Any], str, list[RequestFacts], list[RequestFacts]]] = [
    ({"shared_prefix": True}, "shared_prefix", [facts(shared_prefix=True)], [facts()]),
    ({"shared_prefix": False}, "no_shared_prefix", [facts()], [facts(shared_prefix=True)]),
    (
        {"platform": "mac"},
        "platform:mac",
        [facts(platform="mac")],
        [facts(), facts(platform="no_nvidia_gpu")],
    ),
    (
        {"platform": "no_nvidia_gpu"},
        "platform:no_nvidia_gpu",
        [facts(platform="no_nvidia_gpu")],
        [facts(), facts(platform="mac")],
    ),
    (
        {"header": {"X-Tier": "batch"}},
        "header:x-tier",
        [facts(headers={"x-tier": "batch"}), facts(headers={"x-tier": "batch", "x-other": "1"})],
        [facts(), facts(headers={"x-tier": "Batch"}), facts(headers={"x-tier": "batch "})],
    ),
    (
        {"header": {"x-a": "1", "X-B": "2"}},
        "header:x-a,header:x-b",
        [facts(headers={"x-a": "1", "x-b": "2"})],
        [facts(headers={"x-a": "1"}), facts(headers={"x-b": "2"}), facts(headers={"x-a": "1", "x-b": "3"})],
    ),
    (
        {"model": "llama-3-*"},
        "model:llama-3-*",
        [facts(), facts(model="llama-3-70b")],
        [facts(model="llama-2-7b"), facts(model="LLAMA-3-8b"), facts(model="x-llama-3-8b")],
    ),
    ({"model": "llama-3-8b"}, "model:llama-3-8b", [facts()], [facts(model="llama-3-8b-instruct")]),
    (
        {"min_prompt_tokens": 1000},
        "min_prompt_tokens:1000",
        [facts(prompt_tokens=1000), facts(prompt_tokens=90_000)],
        [facts(prompt_tokens=999), facts(prompt_tokens=0)],
    ),
    (
        {"max_prompt_tokens": 100},
        "max_prompt_tokens:100",
        [facts(prompt_tokens=100), facts(prompt_tokens=0)],
        [facts(prompt_tokens=101)],
    ),
    (
        {"min_prompt_tokens": 10, "max_prompt_tokens": 20},
        "min_prompt_tokens:10,max_prompt_tokens:20",
        [facts(prompt_tokens=10), facts(prompt_tokens=20)],
        [facts(prompt_tokens=9), facts(prompt_tokens=21)],
    ),
    ({"has_tools": True}, "has_tools", [facts(has_tools=True)], [facts()]),
    ({"has_tools": False}, "no_tools", [facts()], [facts(has_tools=True)]),
    ({"stream": True}, "stream", [facts(stream=True)], [facts()]),
    ({"stream": False}, "no_stream", [facts()], [facts(stream=True)]),
    (
        {"shared_prefix": True, "stream": True, "platform": "nvidia_gpu"},
        "shared_prefix,platform:nvidia_gpu,stream",
        [facts(shared_prefix=True, stream=True)],
        [
            facts(shared_prefix=True),
            facts(stream=True),
            facts(shared_prefix=True, stream=True, platform="mac"),
        ],
    ),
    ({}, "default", [facts(), facts(shared_prefix=True, platform="mac", stream=True)], []),
]


@pytest.mark.parametrize(("when", "label", "yes", "no"), CONDITIONS, ids=[c[1] for c in CONDITIONS])
def test_each_condition(when: dict[str, Any], label: str, yes: list[RequestFacts], no: list[RequestFacts]) -> None:
    r = one_rule(**when)
    assert rule_label(r.rules[0]) == label
    for f in yes:
        assert matches(r.rules[0].when, f)
        assert select_pool(r, f, ALL) == Decision("sglang", label)
    for f in no:
        assert not matches(r.rules[0].when, f)
        assert select_pool(r, f, ALL) == Decision("vllm", "default")  # no rule matched: first pool


def test_a_named_rule_uses_its_name() -> None:
    r = route(RuleConfig(name="agents", when=RuleWhen(shared_prefix=True), pool="sglang"))
    assert select_pool(r, facts(shared_prefix=True), ALL) == Decision("sglang", "agents")


def test_first_match_wins() -> None:
    r = route(
        RuleConfig(when=RuleWhen(platform="mac"), pool="llamacpp"),
        RuleConfig(when=RuleWhen(shared_prefix=True), pool="sglang"),
        RuleConfig(pool="vllm"),
    )
    assert select_pool(r, facts(platform="mac", shared_prefix=True), ALL) == Decision("llamacpp", "platform:mac")
    assert select_pool(r, facts(shared_prefix=True), ALL) == Decision("sglang", "shared_prefix")
    assert select_pool(r, facts(), ALL) == Decision("vllm", "default")


def test_a_catch_all_rule_picks_its_own_pool() -> None:
    r = route(RuleConfig(when=RuleWhen(stream=True), pool="sglang"), RuleConfig(pool="llamacpp"))
    assert select_pool(r, facts(), ALL) == Decision("llamacpp", "default")


def test_no_rules_picks_the_first_pool() -> None:
    assert select_pool(route(pools=("sglang", "vllm")), facts(), ALL) == Decision("sglang", "default")


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        ({"vllm", "sglang", "llamacpp"}, Decision("sglang", "shared_prefix")),
        ({"vllm", "llamacpp"}, Decision("vllm", "fallback:vllm")),
        ({"llamacpp"}, Decision("llamacpp", "fallback:llamacpp")),
        ({"llamacpp", "sglang"}, Decision("sglang", "shared_prefix")),
        (set(), None),
    ],
)
def test_fallback_through_route_pools_in_order(available: set[str], expected: Decision | None) -> None:
    r = route(RuleConfig(when=RuleWhen(shared_prefix=True), pool="sglang"))
    f = facts(shared_prefix=True)
    assert select_pool(r, f, frozenset(available)) == expected
    assert select_pool(r, f, lambda pool: pool in available) == expected  # a predicate works the same


def test_default_pool_unavailable_falls_back() -> None:
    assert select_pool(route(), facts(), {"llamacpp", "sglang"}) == Decision("sglang", "fallback:sglang")


def test_ordered_fallbacks_lists_the_other_available_pools() -> None:
    r = route()
    assert ordered_fallbacks(r, "sglang", ALL) == [
        Decision("vllm", "fallback:vllm"),
        Decision("llamacpp", "fallback:llamacpp"),
    ]
    assert ordered_fallbacks(r, "vllm", {"vllm", "llamacpp"}) == [Decision("llamacpp", "fallback:llamacpp")]
    assert ordered_fallbacks(r, "vllm", lambda pool: False) == []


def test_the_label_does_not_depend_on_header_order() -> None:
    a = RuleConfig(when=RuleWhen(header={"x-b": "1", "x-a": "2"}), pool="vllm")
    b = RuleConfig(when=RuleWhen(header={"x-a": "2", "x-b": "1"}), pool="vllm")
    assert rule_label(a) == rule_label(b) == "header:x-a,header:x-b"
