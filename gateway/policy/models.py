"""Model names: a client's name through the config's aliases to a route, the index of which pools
serve which model (rebuilt when discovery changes), the pool for a name (exact servers first, then
the route's rules), and the name sent to the chosen backend. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType

from gateway.config import GatewayConfig, RouteConfig
from gateway.policy.rules import Decision, RequestFacts, matches, rule_label, select_pool
from gateway.value import value

SERVED = "served"
"""The rule label when the pools that serve a name exactly were chosen by no rule of the route."""
_NOTHING: Mapping[str, tuple[str, ...]] = MappingProxyType({})


@value
class Resolved:
    route: RouteConfig
    name: str
    """The model name after aliases: what the index is asked about and, by default, what is sent."""


class ModelNames:
    """A client's name -> (route, name): an alias (global first, then the route's own), else the name
    itself under the route it matches (exact routes before globs). Known names are one dict lookup."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        known: dict[str, Resolved] = {}
        for route in config.routes:
            if not route.is_glob:
                known.setdefault(route.model, Resolved(route, route.model))
        for route in config.routes:
            for alias, target in route.aliases.items():
                if config.route_for(alias) is route and alias not in known:
                    known[alias] = Resolved(route, target)
        for alias, target in config.aliases.items():
            found = config.route_for(target) or config.route_for(alias)
            if found is not None:
                known[alias] = Resolved(found, target)
        self._known = known

    def resolve(self, requested: str) -> Resolved | None:
        found = self._known.get(requested)
        if found is not None:
            return found
        route = self._config.route_for(requested)
        return None if route is None else Resolved(route, requested)

    def aliases(self) -> dict[str, str]:
        """Every alias the config defines -> its model name."""
        out: dict[str, str] = {}
        for route in self._config.routes:
            out.update(route.aliases)
        out.update(self._config.aliases)
        return out


@value
class ModelIndex:
    """Exact model name -> pool -> the backends of that pool that serve it (by name)."""

    serving: Mapping[str, Mapping[str, tuple[str, ...]]]
    unknown: frozenset[str] = frozenset()
    """Pools none of whose backends has said what it serves (never reached, or no /v1/models)."""

    def pools(self, model: str) -> Mapping[str, tuple[str, ...]]:
        return self.serving.get(model, _NOTHING)


EMPTY_INDEX = ModelIndex(MappingProxyType({}))


def build_index(members: Iterable[tuple[str, str, Iterable[str]]]) -> ModelIndex:
    """From (pool, backend, names it serves) triples."""
    serving: dict[str, dict[str, list[str]]] = {}
    pools_seen: set[str] = set()
    known: set[str] = set()
    for pool, backend, names in members:
        pools_seen.add(pool)
        for name in names:
            known.add(pool)
            serving.setdefault(name, {}).setdefault(pool, []).append(backend)
    return ModelIndex(
        MappingProxyType(
            {name: MappingProxyType({p: tuple(b) for p, b in pools.items()}) for name, pools in serving.items()}
        ),
        frozenset(pools_seen - known),
    )


def choose_pool(
    route: RouteConfig,
    facts: RequestFacts,
    serving: AbstractSet[str],
    available: Callable[[str], bool],
    servers: AbstractSet[str] | None = None,
) -> Decision | None:
    """The pool for a request. `servers`: the pools with a backend that serves the name exactly, and
    those that have not said what they serve (the index's `unknown`); `serving`: the pools with a
    healthy backend that serves it exactly. When there are such, only they are chosen from: the
    first matching rule that names a server picks it (if that pool is down or unknown, the route's
    first healthy server is the `fallback:<pool>`); no rule naming one: the first healthy server in
    the route's order (`default` when it is the route's first pool, else `served`). When there is
    none, the rules as for any name (select_pool)."""
    if serving:
        for rule in route.rules:
            if rule.pool in (servers or serving) and matches(rule.when, facts):
                if rule.pool in serving:
                    return Decision(rule.pool, rule_label(rule))
                pool = next(p for p in route.pools if p in serving)
                return Decision(pool, f"fallback:{pool}")
        for pool in route.pools:
            if pool in serving:
                return Decision(pool, "default" if pool == route.pools[0] else SERVED)
    return select_pool(route, facts, available)


def upstream_model(
    requested: str,
    name: str,
    *,
    configured: str | None,
    route_upstream: str | None,
    served: tuple[str, ...],
    wildcard: bool,
) -> str | None:
    """The model name to send to one backend, None for the client's own. In order: the backend's
    `model:` from the config, the route's `upstream_model`, the name itself when the backend serves
    it (or reports nothing), and under a wildcard route a name the backend does not serve becomes
    the one model it serves (the rewrite that `x-gateway-model` reports)."""
    chosen = configured or route_upstream
    if chosen is None:
        rewrite = wildcard and len(served) == 1 and name not in served
        chosen = served[0] if rewrite else name
    return None if chosen == requested else chosen
