"""`gateway explain`: how a request body would be routed (fingerprint, rule evaluation, the
balancer's order), computed by the same code the gateway runs, without sending anything."""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.fleet.registry import Registry
from gateway.metrics import GatewayMetrics
from gateway.pipeline.context import read
from gateway.pipeline.router import Router
from gateway.policy.rules import Platform, matches, rule_label
from gateway.protocols.base import Api
from gateway.protocols.catalog import PROTOCOLS


def explain(config: GatewayConfig, raw: bytes, kind: Api = "chat", platform: Platform | None = None) -> dict[str, Any]:
    from gateway.hostinfo import resolve_platform

    protocol = PROTOCOLS[kind]
    try:
        inbound = protocol.parse(raw, config.limits)
    except GatewayError as exc:
        return {"error": exc.body()["error"]}
    route = config.route_for(inbound.model)
    if route is None:
        return {"error": {"message": f"no route for model {inbound.model!r}", "code": "model_not_found"}}
    registry = Registry(config)
    for backend in registry:  # explain assumes every backend is healthy; it does no I/O
        backend.healthy = backend.checked = True
    router = Router(config, registry, GatewayMetrics(), platform or resolve_platform(config.routing.platform))
    plan = router.plan(read(protocol, inbound, route, inbound.model, {}))
    facts, fp = plan.facts, plan.fingerprint
    return {
        "kind": kind,
        "route": route.label,
        "platform": router.platform,
        "fingerprint_blocks": len(fp),
        "fingerprint_head": [f"{h:016x}" for h in fp[:4]],
        "shared_prefix": facts.shared_prefix,
        "rules": [{"rule": rule_label(r), "pool": r.pool, "matches": matches(r.when, facts)} for r in route.rules],
        "decision": {"pool": plan.pool, "rule": plan.rule},
        "backends_in_order": [b.name for b in plan.backends],
    }
