"""The gateway's configuration: frozen pydantic models for gateway.yaml (reading the file, `${ENV}`
substitution and the errors that name a YAML path are gateway/config_loader.py's). A leaf: the
package imports nothing else from the gateway. Each part of the file has its module: `settings`
(the gateway's own sections), `pools` and `routes`; `schema` holds what they share, and this module
the whole file's model, which checks the references between the parts."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Annotated

from pydantic import Field, model_validator

from gateway.config.pools import BackendConfig, InferencePoolRef, KVEventsSource, PoolConfig, backend_name
from gateway.config.routes import CapsConfig, RouteConfig, RuleConfig, RuleWhen
from gateway.config.schema import NAME_PATTERN, BalancerKind, EngineKind, PlatformName, Priority, Section
from gateway.config.settings import (
    BudgetConfig,
    ClientKeyConfig,
    HealthConfig,
    LimitsConfig,
    RedisConfig,
    RetryConfig,
    RoutingConfig,
    ServerConfig,
    SharedPrefixConfig,
    SharingConfig,
    TimeoutsConfig,
    TracingConfig,
)

__all__ = [
    "NAME_PATTERN",
    "BackendConfig",
    "BalancerKind",
    "BudgetConfig",
    "CapsConfig",
    "ClientKeyConfig",
    "EngineKind",
    "GatewayConfig",
    "HealthConfig",
    "InferencePoolRef",
    "KVEventsSource",
    "LimitsConfig",
    "PlatformName",
    "PoolConfig",
    "Priority",
    "RedisConfig",
    "RetryConfig",
    "RouteConfig",
    "RoutingConfig",
    "RuleConfig",
    "RuleWhen",
    "Section",
    "ServerConfig",
    "SharedPrefixConfig",
    "SharingConfig",
    "TimeoutsConfig",
    "TracingConfig",
    "backend_name",
    "with_inference_pool",
]


class GatewayConfig(Section):
    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    retry: RetryConfig = RetryConfig()
    health: HealthConfig = HealthConfig()
    routing: RoutingConfig = RoutingConfig()
    keys: tuple[ClientKeyConfig, ...] = ()
    sharing: SharingConfig = SharingConfig()
    redis: RedisConfig | None = None
    tracing: TracingConfig | None = None
    pools: Mapping[Annotated[str, Field(pattern=NAME_PATTERN)], PoolConfig]
    routes: Annotated[tuple[RouteConfig, ...], Field(min_length=1)]
    aliases: Mapping[str, str] = {}
    """Client-facing names for served models, for every route: checked before any route's own."""

    @model_validator(mode="after")
    def _check_references(self) -> GatewayConfig:
        problems: list[str] = []
        for i, route in enumerate(self.routes):
            for j, ref in enumerate(route.pools):
                if ref not in self.pools:
                    problems.append(f"routes.{i}.pools.{j}: unknown pool {ref!r}")
            for j, rule in enumerate(route.rules):
                if rule.pool not in route.pools:
                    problems.append(f"routes.{i}.rules.{j}.pool: {rule.pool!r} is not in this route's pools")
        seen: set[str] = set()
        for pool_name, pool in self.pools.items():
            for j, backend in enumerate(pool.backends):
                name = backend_name(pool_name, j, backend)
                if name in seen:
                    problems.append(f"pools.{pool_name}.backends.{j}.name: duplicate backend name {name!r}")
                seen.add(name)
        for where, aliases in (
            ("aliases", self.aliases),
            *((f"routes.{i}.aliases", r.aliases) for i, r in enumerate(self.routes)),
        ):
            for alias, target in aliases.items():
                if not alias or any(c in alias for c in "*?[") or not target:
                    problems.append(f"{where}.{alias}: an alias is a plain name for a non-empty model name")
        names = [k.name for k in self.keys]
        for name in {x for x in names if names.count(x) > 1}:
            problems.append(f"keys: duplicate key name {name!r}")
        labels = [r.label for r in self.routes]
        for label in {x for x in labels if labels.count(x) > 1}:
            problems.append(f"routes: duplicate route name {label!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def route_for(self, model: str) -> RouteConfig | None:
        """Exact names win over globs; among globs, the first listed wins."""
        for route in self.routes:
            if not route.is_glob and route.model == model:
                return route
        for route in self.routes:
            if route.is_glob and fnmatch.fnmatchcase(model, route.model):
                return route
        return None


def with_inference_pool(config: GatewayConfig, name: str | None, namespace: str | None) -> GatewayConfig:
    """The config with its one `inference_pool` entry renamed (`gateway epp --pool-name`,
    `--pool-namespace`); ValueError when it has none or several."""
    if name is None and namespace is None:
        return config
    found = [(p, i) for p, pool in config.pools.items() for i, b in enumerate(pool.backends) if b.inference_pool]
    if len(found) != 1:
        raise ValueError(
            f"--pool-name/--pool-namespace rename the one backend entry with inference_pool:, and the config has "
            f"{len(found)} (the entry says which engine, model and limits the pool's pods have)"
        )
    (pool_name, index), pool = found[0], config.pools[found[0][0]]
    entry = pool.backends[index]
    assert entry.inference_pool is not None
    update: dict[str, str] = {}
    if name is not None:
        update["name"] = name
    if namespace is not None:
        update["namespace"] = namespace
    ref = InferencePoolRef.model_validate({**entry.inference_pool.model_dump(), **update})
    backends = list(pool.backends)
    backends[index] = entry.model_copy(update={"inference_pool": ref})
    pools = dict(config.pools)
    pools[pool_name] = pool.model_copy(update={"backends": tuple(backends)})
    return config.model_copy(update={"pools": pools})
