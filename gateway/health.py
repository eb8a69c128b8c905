"""Active health checks: an asyncio task, started in lifespan, that polls each backend's health
path and flips it in the registry. Passive ejection (5xx, connect errors) lives in the proxy."""

from __future__ import annotations

import asyncio
import logging

from gateway.config import HealthConfig
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.registry import Backend, Registry
from gateway.upstream import UpstreamClient

log = logging.getLogger(__name__)


class HealthChecker:
    def __init__(self, registry: Registry, upstream: UpstreamClient, metrics: GatewayMetrics,
                 config: HealthConfig) -> None:
        self._registry = registry
        self._upstream = upstream
        self._metrics = metrics
        self._config = config

    async def check(self, backend: Backend) -> bool:
        headers = backend.auth_headers()
        try:
            status, _ = await self._upstream.get(backend.url + backend.adapter.health_path, headers,
                                                 self._config.timeout_s, backend.name, max_bytes=64 * 1024)
        except GatewayError:
            return False
        return 200 <= status < 300

    async def check_all(self) -> None:
        backends = list(self._registry)
        results = await asyncio.gather(*(self.check(b) for b in backends))
        for backend, ok in zip(backends, results, strict=True):
            was = backend.healthy
            self._registry.record_check(backend, ok)
            now = backend.healthy
            self._metrics.backend_up.labels(backend.pool, backend.name, backend.engine).set(1 if now else 0)
            if was != now:
                log.log(logging.INFO if now else logging.WARNING, "backend %s (%s) is now %s", backend.name,
                        backend.pool, "healthy" if now else "unhealthy")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._config.interval_s)
            try:
                await self.check_all()
            except Exception:  # a bug here must not stop health checking for good
                log.exception("health check round failed")
