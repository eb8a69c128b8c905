"""Route rules: the facts about one request, and the pool the route's rules pick for it, with the
rule's label for `x-gateway-rule` and the decision metric. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from fnmatch import fnmatchcase
from typing import Literal

from gateway.config import RouteConfig, RuleConfig, RuleWhen
from gateway.value import value

Platform = Literal["mac", "no_nvidia_gpu", "nvidia_gpu"]
Availability = Callable[[str], bool] | AbstractSet[str]


@value
class RequestFacts:
    """What the rules may look at. `headers` has lower-cased names; `prompt_tokens` is an estimate."""

    model: str
    stream: bool
    has_tools: bool
    headers: Mapping[str, str]
    prompt_tokens: int
    shared_prefix: bool
    platform: Platform


@value
class Decision:
    pool: str
    rule: str
    """The matched rule's name, a label derived from its conditions, `default`, or `fallback:<pool>`."""


def matches(when: RuleWhen, facts: RequestFacts) -> bool:
    """True when every condition set in `when` holds; an empty `when` matches everything."""
    if when.shared_prefix is not None and when.shared_prefix != facts.shared_prefix:
        return False
    if when.platform is not None and when.platform != facts.platform:
        return False
    if when.has_tools is not None and when.has_tools != facts.has_tools:
        return False
    if when.stream is not None and when.stream != facts.stream:
        return False
    if when.min_prompt_tokens is not None and facts.prompt_tokens < when.min_prompt_tokens:
        return False
    if when.max_prompt_tokens is not None and facts.prompt_tokens > when.max_prompt_tokens:
        return False
    if when.model is not None and not fnmatchcase(facts.model, when.model):
        return False
    if when.header:
        for name, value in when.header.items():
            if facts.headers.get(name.lower()) != value:
                return False
    return True


def rule_label(rule: RuleConfig) -> str:
    """The rule's name, or one derived from its conditions (config-defined, so a bounded label)."""
    if rule.name:
        return rule.name
    when = rule.when
    parts: list[str] = []
    if when.shared_prefix is not None:
        parts.append("shared_prefix" if when.shared_prefix else "no_shared_prefix")
    if when.platform is not None:
        parts.append(f"platform:{when.platform}")
    if when.header:
        parts.extend(f"header:{name}" for name in sorted(name.lower() for name in when.header))
    if when.model is not None:
        parts.append(f"model:{when.model}")
    if when.min_prompt_tokens is not None:
        parts.append(f"min_prompt_tokens:{when.min_prompt_tokens}")
    if when.max_prompt_tokens is not None:
        parts.append(f"max_prompt_tokens:{when.max_prompt_tokens}")
    if when.has_tools is not None:
        parts.append("has_tools" if when.has_tools else "no_tools")
    if when.stream is not None:
        parts.append("stream" if when.stream else "no_stream")
    return ",".join(parts) or "default"


def _is_available(available: Availability) -> Callable[[str], bool]:
    if isinstance(available, AbstractSet):
        return available.__contains__
    return available


def select_pool(route: RouteConfig, facts: RequestFacts, available: Availability) -> Decision | None:
    """The first rule whose conditions all hold picks the pool. With no rules, or none matching, the
    route's first pool is the `default`. An unavailable pick falls back through `route.pools` in
    order; None when no pool is available."""
    is_available = _is_available(available)
    first = Decision(route.pools[0], "default")
    for rule in route.rules:
        if matches(rule.when, facts):
            first = Decision(rule.pool, rule_label(rule))
            break
    if is_available(first.pool):
        return first
    fallbacks = ordered_fallbacks(route, first.pool, is_available)
    return fallbacks[0] if fallbacks else None


def ordered_fallbacks(route: RouteConfig, chosen: str, available: Availability) -> list[Decision]:
    """The route's other available pools, in config order, each labelled `fallback:<pool>`: where the
    proxy goes next when `chosen` has no backend left to try."""
    is_available = _is_available(available)
    return [Decision(pool, f"fallback:{pool}") for pool in route.pools if pool != chosen and is_available(pool)]
