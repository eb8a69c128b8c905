"""`gateway explain`: how a request body would be routed (fingerprint, rule evaluation, the
balancer's order), computed by the same code the gateway runs, without sending anything."""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.inbound import Kind, parse_request
from gateway.metrics import GatewayMetrics
from gateway.registry import Registry
from gateway.router import Router
from gateway.rules import Platform, matches, rule_label


def explain(config: GatewayConfig, raw: bytes, kind: Kind = "chat", platform: Platform | None = None) -> dict[str, Any]:
    from gateway.hostinfo import resolve_platform

    try:
        inbound = parse_request(
            kind,
            raw,
            max_depth=config.limits.max_json_depth,
            max_n=config.limits.max_n,
            max_messages=config.limits.max_messages,
            max_nodes=config.limits.max_json_nodes,
            max_containers=config.limits.max_json_containers,
        )
    except GatewayError as exc:
        return {"error": exc.body()["error"]}
    route = config.route_for(inbound.model)
    if route is None:
        return {"error": {"message": f"no route for model {inbound.model!r}", "code": "model_not_found"}}
    registry = Registry(config)
    for backend in registry:  # explain assumes every backend is healthy; it does no I/O
        registry.set_health(backend, True)
    router = Router(config, registry, GatewayMetrics(), platform or resolve_platform(config.routing.platform))
    plan = router.plan(route, inbound, {})
    facts, fp = plan.facts, plan.fingerprint
    k: Kind = inbound.kind
    return {
        "kind": k,
        "route": route.label,
        "platform": router.platform,
        "fingerprint_blocks": len(fp),
        "fingerprint_head": [f"{h:016x}" for h in fp[:4]],
        "shared_prefix": facts.shared_prefix,
        "rules": [{"rule": rule_label(r), "pool": r.pool, "matches": matches(r.when, facts)} for r in route.rules],
        "decision": {"pool": plan.pool, "rule": plan.rule},
        "backends_in_order": [b.name for b in plan.backends],
    }
