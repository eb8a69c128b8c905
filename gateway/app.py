"""create_app(config): the one composition root. Every long-lived object (the aiohttp session,
the registry, the metrics, background tasks) is built here and lives in lifespan, not globals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from gateway.config import GatewayConfig
from gateway.enforcer import CapEnforcer
from gateway.handler import CompletionEndpoint
from gateway.health import HealthChecker
from gateway.hostinfo import resolve_platform
from gateway.lifecycle import Lifecycle
from gateway.metrics import GatewayMetrics
from gateway.proxy import Proxy
from gateway.registry import Registry
from gateway.router import Router
from gateway.routes import Endpoints, http_exception
from gateway.rules import Platform
from gateway.scraper import LoadScraper
from gateway.upstream import UpstreamClient

log = logging.getLogger(__name__)


@dataclass
class Gateway:
    """Everything one running gateway owns; reachable as app.state.gateway for tests."""

    config: GatewayConfig
    metrics: GatewayMetrics
    registry: Registry
    upstream: UpstreamClient
    router: Router
    caps: CapEnforcer
    proxy: Proxy
    health: HealthChecker
    scraper: LoadScraper
    lifecycle: Lifecycle


def build(config: GatewayConfig, platform: Platform | None = None) -> Gateway:
    metrics = GatewayMetrics()
    registry = Registry(config)
    upstream = UpstreamClient(config.timeouts)
    resolved = platform or resolve_platform(config.routing.platform)
    return Gateway(
        config=config, metrics=metrics, registry=registry, upstream=upstream,
        router=Router(config, registry, metrics, resolved),
        caps=CapEnforcer(upstream, metrics),
        proxy=Proxy(registry, upstream, metrics, max_attempts=config.retry.max_attempts,
                    idle_s=config.timeouts.idle_s, keepalive_s=config.timeouts.keepalive_s,
                    first_byte_s=config.timeouts.first_byte_s),
        health=HealthChecker(registry, upstream, metrics, config.health),
        scraper=LoadScraper(registry, upstream, metrics, config.health),
        lifecycle=Lifecycle(),
    )


def create_app(config: GatewayConfig, platform: Platform | None = None) -> GatewayApp:
    gw = build(config, platform)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.upstream.start()
        # One health round before serving, so /readyz and routing are right from the first request.
        await gw.health.check_all()
        for backend in gw.registry:
            if not backend.healthy:
                log.warning("backend %s (pool %s, %s) is not healthy at start-up: %s%s does not answer 2xx",
                            backend.name, backend.pool, backend.engine, backend.url, backend.adapter.health_path)
        tasks = [asyncio.create_task(gw.health.run(), name="health"),
                 asyncio.create_task(gw.scraper.run(), name="scraper")]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await gw.upstream.close()

    endpoints = [
        CompletionEndpoint(kind, config, gw.registry, gw.router, gw.caps, gw.proxy, gw.metrics, gw.lifecycle)
        for kind in ("chat", "completions", "embeddings")
    ]
    routes = Endpoints(config, gw.registry, gw.metrics, gw.scraper, gw.lifecycle).routes(endpoints)
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_exception})
    app.state.gateway = gw
    return GatewayApp(app, {e.path: e for e in endpoints})


class GatewayApp:
    """The ASGI entry point. The completion paths go straight to their endpoint, skipping
    Starlette's middleware and routing (~17 us a request, measured); everything else, lifespan
    included, goes through Starlette."""

    def __init__(self, app: Starlette, fast: dict[str, CompletionEndpoint]) -> None:
        self.app = app
        self.state = app.state
        self._fast = fast

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self._fast.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)
