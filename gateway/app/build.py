"""create_app(config): the one composition root. Every long-lived object (the upstream client,
the registry, the metrics, background tasks) is built here and lives in lifespan, not globals;
reload(config) builds the next one and swaps it in."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route

from gateway.access.gate import AccessGate, CounterStore
from gateway.access.keys import KeyRing
from gateway.access.memory_store import MemoryStore
from gateway.app.background import start_gateway, stop_gateway
from gateway.app.instance import Gateway
from gateway.app.loop_lag import LoopLag
from gateway.app.routes import Endpoints, http_exception
from gateway.asgi import Receive, Scope, Send
from gateway.config import GatewayConfig
from gateway.fleet.capacity import Capacity
from gateway.fleet.health import HealthChecker, HealthState, PassiveHealth
from gateway.fleet.registry import Registry
from gateway.fleet.scraper import LoadScraper
from gateway.hostinfo import resolve_platform
from gateway.metrics import GatewayMetrics
from gateway.pipeline.accounting import Accounting
from gateway.pipeline.admission import Admission
from gateway.pipeline.attempts import Attempts
from gateway.pipeline.chat_tokenizer import ChatTokenizer
from gateway.pipeline.endpoint import CompletionEndpoint, Stages
from gateway.pipeline.enforcer import CapEnforcer
from gateway.pipeline.lifecycle import Lifecycle
from gateway.pipeline.prompt_tokens import PromptTokens
from gateway.pipeline.relay import Relay
from gateway.pipeline.router import Router
from gateway.pipeline.stored import StoredResponses
from gateway.policy.rules import Platform
from gateway.protocols.base import ProtocolAdapter
from gateway.protocols.catalog import ENDPOINTS, REASONING_COPY
from gateway.protocols.response_store import ResponseStore
from gateway.tracing.base import NoTracing, Tracing
from gateway.tracing.settings import tracing_settings
from gateway.upstream.client import UpstreamClient

if TYPE_CHECKING:
    from gateway.fleet.inference_pool import PoolFollower

log = logging.getLogger(__name__)

RELOAD_SYNC_S = 5.0


def make_tracing(config: GatewayConfig, env: Mapping[str, str]) -> Tracing:
    """The tracer the `tracing:` block or the OTEL_* variables ask for; NoTracing when neither does,
    and then the recorder and its exporter are not even imported."""
    settings = tracing_settings(config.tracing, env)
    if settings is None:
        return NoTracing()
    from gateway.tracing.recorder import RecordingTracing  # only a tracing gateway loads it

    log.info(
        "tracing on (%s): service %s, sampler %s%s, exporting to %s",
        settings.source,
        settings.service_name,
        settings.sampler,
        f" {settings.ratio}" if "ratio" in settings.sampler else "",
        settings.export.endpoint,
    )
    return RecordingTracing(settings)


def access_gate(config: GatewayConfig, metrics: GatewayMetrics, memory: MemoryStore | None = None) -> AccessGate:
    """Client keys and their limits: counted in Redis when `redis:` is configured (shared by every
    replica), else in this process (`memory`, kept across reloads)."""
    store: CounterStore
    if config.redis is not None:
        from gateway.access.redis_store import RedisStore  # only a Redis-backed gateway needs the client

        store, name = RedisStore(config.redis.url.get_secret_value(), config.redis.timeout_s), "redis"
        fail_open, prefix = config.redis.fail_open, config.redis.key_prefix
    else:
        store, name, fail_open, prefix = memory or MemoryStore(), "memory", True, "gateway:rl:"
    return AccessGate(KeyRing.from_config(config), store, name, metrics, fail_open=fail_open, prefix=prefix)


def build(
    config: GatewayConfig,
    platform: Platform | None = None,
    metrics: GatewayMetrics | None = None,
    lifecycle: Lifecycle | None = None,
    memory: MemoryStore | None = None,
    responses: ResponseStore | None = None,
    tracing: Tracing | None = None,
) -> Gateway:
    metrics = metrics or GatewayMetrics()
    registry = Registry(config)
    capacity = Capacity(registry, config.retry, config.sharing)
    health_state = HealthState(config.health)
    upstream = UpstreamClient(config.timeouts)
    resolved = platform or resolve_platform(config.routing.platform)
    lifecycle = lifecycle or Lifecycle()
    kv_events = None
    if any(b.kv_events is not None for pool in config.pools.values() for b in pool.backends):
        # Imported only here: a gateway without event sources loads neither pyzmq nor msgspec.
        from gateway.fleet.kvevents.fleet import follow

        kv_events = follow(config, metrics)
    router = Router(config, registry, metrics, resolved, kv_events)
    accounting = Accounting(metrics)
    timeouts = config.timeouts
    passive = PassiveHealth(health_state, metrics)
    relay = Relay(
        metrics,
        accounting,
        lifecycle,
        passive,
        timeouts.idle_s,
        timeouts.keepalive_s,
        timeouts.first_byte_s,
        config.limits.max_response_bytes,
        config.limits.max_event_bytes,
    )
    health = HealthChecker(registry, health_state, upstream, metrics, config.health)
    followers: list[PoolFollower] = []
    if registry.pool_entries:
        # Imported only here: a gateway without an InferencePool loads no httpx.
        from gateway.fleet.inference_pool import PoolFollower

        followers = [PoolFollower(registry, e, health, metrics, os.environ) for e in registry.pool_entries]
    return Gateway(
        config=config,
        metrics=metrics,
        registry=registry,
        capacity=capacity,
        health_state=health_state,
        upstream=upstream,
        router=router,
        caps=CapEnforcer(upstream, metrics),
        accounting=accounting,
        admission=Admission(capacity, router, config.limits, metrics, config.sharing),
        relay=relay,
        attempts=Attempts(capacity, passive, upstream, router, relay, metrics, accounting),
        health=health,
        scraper=LoadScraper(registry, upstream, metrics, config.health),
        lifecycle=lifecycle,
        access=access_gate(config, metrics, memory),
        responses=responses or ResponseStore(config.limits.max_response_ids),
        kv_events=kv_events,
        tokens=PromptTokens(config, registry, upstream, set(kv_events.subscribers), metrics, pool_tokenizers(config))
        if kv_events
        else None,
        tracing=tracing or NoTracing(),
        pool_followers=followers,
    )


def pool_tokenizers(config: GatewayConfig) -> dict[str, ChatTokenizer]:
    """Each kv_events pool's tokenizer, loaded from the files its config names (TokenizerError: the
    gateway does not start)."""
    return {name: ChatTokenizer.load(p.tokenizer) for name, p in config.pools.items() if p.tokenizer is not None}


@dataclass
class _Served:
    """One config's gateway and the ASGI apps in front of it."""

    gateway: Gateway
    app: Starlette
    fast: dict[str, CompletionEndpoint]
    tasks: list[asyncio.Task[None]]
    active: int = 0
    """Completion requests running on this gateway, from the first byte of their handling to the
    last: a retired gateway's session is closed only once this is 0."""


def _variants(protocol: ProtocolAdapter, config: GatewayConfig) -> dict[str, ProtocolAdapter] | None:
    """The routes of this endpoint that get another adapter (reasoning_content: copy), or None."""
    variant = REASONING_COPY.get(protocol.api)
    if variant is None or variant.path != protocol.path:
        return None
    return {r.label: variant for r in config.routes if r.reasoning_content == "copy"} or None


def _assemble(gw: Gateway) -> _Served:
    stages = Stages(
        gw.config,
        gw.access,
        gw.router,
        gw.caps,
        gw.admission,
        gw.attempts,
        gw.relay,
        gw.accounting,
        gw.lifecycle,
        gw.responses,
        gw.tokens,
        gw.tracing,
    )
    endpoints = [CompletionEndpoint(protocol, stages, _variants(protocol, gw.config)) for protocol in ENDPOINTS]
    stored = StoredResponses(gw.access, gw.responses, gw.registry, gw.upstream, gw.config.timeouts.first_byte_s)
    routes = Endpoints(
        gw.config, gw.registry, gw.metrics, gw.scraper, gw.lifecycle, gw.access, exemplars=gw.tracing.enabled
    ).routes(endpoints)
    routes += [
        Route("/v1/responses/{response_id}", stored.get, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", stored.cancel, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_exception})
    # Starlette's trailing-slash redirect builds its Location from the client's Host header (an open
    # redirect: docs/reliability.md defect 11); an unknown path is an OpenAI-shaped 404 instead.
    app.router.redirect_slashes = False
    app.state.gateway = gw
    return _Served(gw, app, {e.path: e for e in endpoints}, [])


async def _start(served: _Served) -> None:
    served.tasks = await start_gateway(served.gateway)


async def _stop(served: _Served) -> None:
    await stop_gateway(served.gateway, served.tasks)


def create_app(
    config: GatewayConfig, platform: Platform | None = None, env: Mapping[str, str] | None = None
) -> GatewayApp:
    return GatewayApp(config, platform, env)


class GatewayApp:
    """The ASGI entry point and the one composition root. The completion paths go straight to
    their endpoint, skipping Starlette's middleware and routing (~17 us a request, measured);
    everything else goes through Starlette; lifespan is handled here.

    reload(config) builds a whole new gateway (registry, session, router, background tasks) and
    swaps it in: new requests use it at once, requests in flight finish on the old one, whose
    session closes when they are done. Metrics and the draining flag carry over."""

    def __init__(
        self, config: GatewayConfig, platform: Platform | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        self._platform = platform
        self._metrics = GatewayMetrics()
        self._lifecycle = Lifecycle()
        self._memory = MemoryStore()  # per-replica limit counters survive a reload
        # One tracer for the process (its exporter's thread and buffer): a reload keeps it.
        self._tracing = make_tracing(config, os.environ if env is None else env)
        self._served = _assemble(
            build(config, platform, self._metrics, self._lifecycle, self._memory, tracing=self._tracing)
        )
        self._retiring: set[asyncio.Task[None]] = set()
        self._loop_lag = LoopLag(self._metrics.loop_lag)  # the process's loop, kept across reloads

    @property
    def app(self) -> Starlette:
        return self._served.app

    @property
    def state(self) -> Any:
        return self._served.app.state

    @property
    def gateway(self) -> Gateway:
        return self._served.gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        served = self._served
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = served.fast.get(scope["path"])
            if endpoint is not None:
                served.active += 1
                try:
                    await endpoint(scope, receive, send)
                finally:
                    served.active -= 1
                return
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await served.app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await _start(self._served)
                except Exception as exc:  # reported to uvicorn, which refuses to start
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                self._loop_lag.start(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self._loop_lag.stop()
                await asyncio.gather(*self._retiring, return_exceptions=True)
                await _stop(self._served)
                await asyncio.to_thread(self._tracing.shutdown)  # the last spans, exported
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def reload(self, config: GatewayConfig) -> None:
        """Swap in a gateway built from `config`; the old one drains in the background."""
        pins = self._served.gateway.responses
        if pins.max_ids != config.limits.max_response_ids:
            pins = pins.resized(config.limits.max_response_ids)
        new = _assemble(
            build(config, self._platform, self._metrics, self._lifecycle, self._memory, pins, self._tracing)
        )
        await _start(new)
        # The old gateway keeps serving while the new one lists its InferencePools' pods (up to
        # RELOAD_SYNC_S: with the API down, the new one goes on without them, and /readyz says so).
        deadline = asyncio.get_running_loop().time() + RELOAD_SYNC_S
        while not new.gateway.registry.synced() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        old, self._served = self._served, new
        gone = {b.name for b in old.gateway.registry} - {b.name for b in new.gateway.registry}
        for name in gone:  # its stored responses went with it: a later request naming one gets a 404
            new.gateway.responses.forget_backend(name)
        task = asyncio.create_task(self._retire(old, gone), name="retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        log.info("config reloaded: %d pools, %d routes", len(config.pools), len(config.routes))

    async def _retire(self, old: _Served, gone: set[str]) -> None:
        """Close the old gateway once its last request has ended, however long that takes: closing
        its session under a live stream would cut it (docs/reliability.md defect 1). No request waits for
        ever: each ends by its own deadlines (timeouts.first_byte_s, idle_s, limits.queue_timeout_s),
        a client leaving, or the drain deadline at shutdown."""
        for task in old.tasks:  # the new gateway checks health and scrapes load from now on
            task.cancel()
        while old.active or old.gateway.capacity.total_in_flight:
            await asyncio.sleep(0.1)
        await _stop(old)
        for backend in old.gateway.registry:
            if backend.name in gone:
                old.gateway.health.forget(backend)
