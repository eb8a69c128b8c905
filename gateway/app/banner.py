"""What `gateway serve` prints once its first health round is done: each model the gateway found
(and each alias) and where a plain request for it routes, one line each, and where any other name
goes under a wildcard route."""

from __future__ import annotations

from gateway.fleet.registry import Registry
from gateway.pipeline.router import Router
from gateway.policy.models import choose_pool, upstream_model
from gateway.policy.rules import RequestFacts


def model_lines(registry: Registry, router: Router, listed: list[str]) -> list[str]:
    """One line per model name in `listed` (the gateway's /v1/models), then one per wildcard route."""
    lines = [_line(registry, router, name) for name in listed]
    for route in router.config.routes:
        if route.is_glob:
            lines.append(_line(registry, router, "", route_label=route.label))
    if not listed:
        lines.insert(0, "no models found yet: no backend answered /v1/models (they are logged when found)")
    return lines


def _line(registry: Registry, router: Router, name: str, route_label: str | None = None) -> str:
    if route_label is not None:
        route = next(r for r in router.config.routes if r.label == route_label)
        target, shown = "", f"any other name ({route.model!r})"
    else:
        resolved = router.resolve(name)
        if resolved is None:
            return f"{name}: no route (requests for it get 404)"
        route, target = resolved.route, resolved.name
        shown = name if target == name else f"{name} (alias of {target})"
    servers = registry.models.pools(target)
    serving = {
        pool
        for pool, members in servers.items()
        if any(registry.by_name[m].healthy for m in members if m in registry.by_name)
    }
    facts = RequestFacts(target or "*", False, False, {}, 0, False, router.platform)
    known = frozenset(servers.keys() | registry.models.unknown)
    decision = choose_pool(route, facts, serving, registry.pool_available, known)
    if decision is None:
        return f"{shown} -> route {route.label}: no healthy pool"
    backends = [b for b in registry.pools.get(decision.pool, ()) if b.healthy]
    where = f"{shown} -> pool {decision.pool} (rule {decision.rule}, route {route.label})"
    if backends:
        b = backends[0]
        sent = upstream_model(
            target or "*",
            target or "*",
            configured=b.model,
            route_upstream=route.upstream_model,
            served=b.names,
            wildcard=route.is_glob,
        )
        if sent is not None and sent != target:
            where += f", sent as {sent}"
        if b.window is not None:
            where += f", window {b.window} tokens"
    return where
