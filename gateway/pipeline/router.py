"""Turn a routed request into a plan: the client's model name through aliases to a route
(resolve), the pool (those whose healthy backends serve the name exactly first, then the route's
rules, with fallback), and the pool's healthy backends in the balancer's order; the name sent to
each backend (upstream_model). Holds the routing memory (prefix tracker,
balancers); the decisions themselves are the pure functions of rules.py and balancer.py, and the
memory learns only from what served (learn(), called once the first byte arrived)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from gateway.config import GatewayConfig, RouteConfig
from gateway.fleet.registry import Backend, Registry
from gateway.metrics import GatewayMetrics
from gateway.pipeline.context import Candidate, Plan, Request
from gateway.policy.balancer import BalanceKey, Balancer, KVEvents, make_balancer
from gateway.policy.cached_prefix import PromptBlocks, PromptIds
from gateway.policy.models import ModelNames, Resolved, choose_pool, upstream_model
from gateway.policy.prefix import (
    PrefixTracker,
    canonical_prompt,
    conversation_anchor,
    fingerprint,
    session_anchor,
    session_key,
)
from gateway.policy.rules import Platform, RequestFacts


class CacheView(Protocol):
    """What the engines' KV events say each backend holds (fleet/kvevents/fleet.py)."""

    def cached(self, names: Iterable[str], tokens: Sequence[int], now: float, whole: bool = True) -> PromptBlocks: ...

    def decided(self, name: str, prompt: PromptBlocks, now: float) -> None: ...


class Router:
    def __init__(
        self,
        config: GatewayConfig,
        registry: Registry,
        metrics: GatewayMetrics,
        platform: Platform,
        kv: CacheView | None = None,
    ) -> None:
        self._config = config
        self._kv = kv
        self._kv_pools = frozenset(name for name, p in config.pools.items() if p.balancer == "kv_events")
        self._registry = registry
        self._metrics = metrics
        self._platform = platform
        self._names = ModelNames(config)
        self._tracker = PrefixTracker(config.routing.shared_prefix)
        self._balancers: dict[str, Balancer] = {
            name: make_balancer(pool.balancer, pool) for name, pool in config.pools.items()
        }
        hashing = ("prefix_affinity", "kv_events")
        self._anchored = frozenset(name for name, p in config.pools.items() if p.balancer in hashing)
        """The pools whose balancer reads a conversation's anchor (no other one does: not computed)."""
        self._needs_prefix = any(p.balancer in hashing for p in config.pools.values()) or any(
            rule.when.shared_prefix is not None for r in config.routes for rule in r.rules
        )

    def resolve(self, requested: str) -> Resolved | None:
        """The route and model name for a client's model name (aliases first); None: no route."""
        return self._names.resolve(requested)

    @property
    def config(self) -> GatewayConfig:
        return self._config

    @property
    def names(self) -> ModelNames:
        return self._names

    def upstream_model(self, plan: Plan, backend: Backend, route_upstream: str | None, requested: str) -> str | None:
        """The model name to send to `backend` for this plan; None: the client's own."""
        return upstream_model(
            requested,
            plan.model or requested,
            configured=backend.model,
            route_upstream=route_upstream,
            served=backend.names,
            wildcard=plan.wildcard,
        )

    def candidates(self, plan: Plan, backends: Sequence[Backend], request: Request, most: int) -> tuple[Candidate, ...]:
        """The first `most` of `backends`, each with the model name it is sent: worked out once."""
        route_upstream, requested = request.route.upstream_model, request.inbound.model
        return tuple(Candidate(b, self.upstream_model(plan, b, route_upstream, requested)) for b in backends[:most])

    def balancer(self, pool: str) -> Balancer:
        """The pool's balancer (its routing memory), for inspection."""
        return self._balancers[pool]

    @property
    def platform(self) -> Platform:
        return self._platform

    def facts(
        self, request: Request, prompt_tokens: int, now: float, model: str
    ) -> tuple[RequestFacts, tuple[int, ...]]:
        fp: tuple[int, ...] = ()
        shared = False
        view = request.view
        if self._needs_prefix and view is not None:
            fp = fingerprint(canonical_prompt(view), self._config.routing.shared_prefix.block_chars)
            shared = self._tracker.observe(fp, now).shared
        inbound = request.inbound
        facts = RequestFacts(
            model=model,
            stream=inbound.stream,
            has_tools=inbound.has_tools,
            headers=request.headers,
            prompt_tokens=prompt_tokens,
            shared_prefix=shared,
            platform=self._platform,
        )
        return facts, fp

    def plan(self, request: Request, prompt_tokens: int = 0, tokens: PromptIds | None = None) -> Plan:
        """The plan for `request`, whose prompt is estimated at `prompt_tokens`; `tokens` are the
        prompt's token ids (or a leading run's), for a kv_events pool (None: not known)."""
        now = time.monotonic()
        route, inbound, view, headers = request.route, request.inbound, request.view, request.headers
        name = request.model
        facts, fp = self.facts(request, prompt_tokens, now, name)
        # One dict lookup: the index is rebuilt when discovery changes, never per request.
        index = self._registry.models
        serving = index.pools(name)
        healthy = self._healthy_servers(serving) if serving else {}
        servers = serving.keys() | index.unknown if healthy else ()
        decision = choose_pool(route, facts, healthy.keys(), self._registry.pool_available, frozenset(servers))
        if decision is None:
            return Plan(pool=route.pools[0], rule="none", backends=[], facts=facts, fingerprint=fp, model=name)
        self._metrics.child(self._metrics.route_decisions, route.label, decision.pool, decision.rule).inc()
        session = session_key(headers, self._config.pools[decision.pool].session_header.lower(), inbound.user)
        anchor = None
        if fp and view and decision.pool in self._anchored:
            anchor = conversation_anchor(view, self._config.routing.shared_prefix.block_chars)
        anchor_key = anchor.key if anchor else None
        if anchor is not None and session is not None:
            anchor_key = session_anchor(session)  # an agent's session first, its first message after
        cached = prompt = None
        if tokens is not None and tokens.ids and self._kv is not None and decision.pool in self._kv_pools:
            names = (b.name for b in self._registry.pools.get(decision.pool, ()))
            prompt = self._kv.cached(names, tokens.ids, now, tokens.whole)
            cached = prompt.cached
        key = BalanceKey(
            fingerprint=fp,
            session=session,
            anchor=anchor_key,
            anchor_block=anchor.block if anchor else 0,
            cached=cached,
        )
        only = healthy.get(decision.pool)
        reserved, explanation = None, None
        if decision.pool in self._kv_pools:
            backends, saturated, explanation = self._order_kv(decision.pool, key, now, only)
            if backends:
                # Load at decision time: admission and the caps' count may await before the
                # attempt takes its in_flight slot, and a burst decided meanwhile must see this one.
                reserved = backends[0]
                reserved.decided += 1
                if prompt is not None and self._kv is not None:
                    self._kv.decided(reserved.name, prompt, now)
            home = None
        else:
            backends, saturated, home = self.order(decision.pool, key, now, only)
        return Plan(
            pool=decision.pool,
            rule=decision.rule,
            backends=backends,
            facts=facts,
            fingerprint=fp,
            key=key,
            saturated=saturated,
            home=home,
            model=name,
            only=only,
            wildcard=route.is_glob,
            reserved=reserved,
            explanation=explanation,
        )

    def _order_kv(
        self, pool: str, key: BalanceKey, now: float, only: tuple[str, ...] | None
    ) -> tuple[list[Backend], bool, str | None]:
        """order() for a kv_events pool, with the balancer's explanation of its choice."""
        balancer = self._balancers[pool]
        assert isinstance(balancer, KVEvents)
        candidates = self._registry.candidates(pool, now)
        if only is not None:
            candidates = [c for c in candidates if c.name in only]
        ordered, choice = balancer.choose(candidates, key)
        by_name = self._registry.by_name
        backends = [by_name[c.name] for c in ordered if by_name[c.name].has_room()]
        return backends, bool(ordered) and not backends, choice.explanation if choice is not None else None

    @staticmethod
    def started(plan: Plan) -> None:
        """The plan's attempt took its in_flight slot (or the request ended before one): the
        decision no longer counts as pending load. Call once per plan."""
        if plan.reserved is not None:
            plan.reserved.decided -= 1

    def pinned(self, request: Request, backend: str | None, prompt_tokens: int = 0) -> Plan | None:
        """A plan of one backend, past the rules and the balancer, for a request that names state only
        `backend` holds; None when that backend is gone or serves none of the route's pools."""
        route = request.route
        found = self._registry.by_name.get(backend) if backend is not None else None
        if found is None or found.retired or found.pool not in route.pools:
            return None
        facts, fp = self.facts(request, prompt_tokens, time.monotonic(), request.inbound.model)
        self._metrics.child(self._metrics.route_decisions, route.label, found.pool, "pinned").inc()
        ready = found.healthy and found.has_room()
        return Plan(found.pool, "pinned", [found] if ready else [], facts, fp, saturated=found.healthy and not ready)

    def engine_kinds(self, route: RouteConfig) -> set[str]:
        """The engine kinds of the route's backends."""
        return {b.engine for pool in route.pools for b in self._registry.pools.get(pool, ())}

    def _healthy_servers(self, serving: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...] | None]:
        """Pool -> its healthy backends that serve the name, and those that never said what they
        serve (None: all of the pool's backends do; the usual case, no scan)."""
        by_name = self._registry.by_name
        out: dict[str, tuple[str, ...] | None] = {}
        for pool, names in serving.items():
            if not any((b := by_name.get(n)) is not None and b.healthy and not b.retired for n in names):
                continue
            members = self._registry.pools.get(pool, ())
            if len(names) == len(members):
                out[pool] = None
            else:
                out[pool] = tuple(b.name for b in members if not b.names or b.name in names)
        return out

    def order(
        self,
        pool: str,
        key: BalanceKey,
        now: float | None = None,
        only: tuple[str, ...] | None = None,
        held_back: int = 0,
    ) -> tuple[list[Backend], bool, str | None]:
        """The pool's healthy backends with capacity (of `only`, when given: those that serve the
        model; less `held_back` slots each, kept for higher classes), in the balancer's order;
        whether some healthy backend was left out only for being full; and the conversation's
        learned home, if any."""
        now = time.monotonic() if now is None else now
        candidates = self._registry.candidates(pool, now)
        if only is not None:
            candidates = [c for c in candidates if c.name in only]
        ordered, home = self._balancers[pool].decide(candidates, key)
        by_name = self._registry.by_name
        backends = [by_name[c.name] for c in ordered if by_name[c.name].has_room(held_back)]
        return backends, bool(ordered) and not backends, home

    def learn(self, plan: Plan, served: str) -> None:
        """The backend `served` sent the first byte of this request's answer: remember it. Called
        once per request, never for one the cap rejected or that no backend took."""
        if plan.key is not None:
            self._balancers[plan.pool].learn(plan.key.fingerprint, served, time.monotonic(), plan.home)
