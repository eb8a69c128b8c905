"""Active health checks: an asyncio task, started in lifespan, that polls each backend's health
path and flips it in the registry. Passive ejection (5xx, connect errors) lives in the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

from gateway.config import HealthConfig
from gateway.errors import GatewayError
from gateway.fleet.registry import Backend, Registry
from gateway.metrics import GatewayMetrics
from gateway.upstream import UpstreamClient

log = logging.getLogger(__name__)


class HealthChecker:
    def __init__(
        self, registry: Registry, upstream: UpstreamClient, metrics: GatewayMetrics, config: HealthConfig
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._metrics = metrics
        self._config = config

    async def check(self, backend: Backend) -> bool:
        headers = backend.auth_headers()
        try:
            status, _ = await self._upstream.get(
                backend.url + backend.adapter.health_path,
                headers,
                self._config.timeout_s,
                backend.name,
                max_bytes=64 * 1024,
            )
        except GatewayError:
            return False
        return 200 <= status < 300

    async def discover(self) -> None:
        """Resolve every `discover: true` entry and update its members. A failed lookup keeps the
        members it had: DNS trouble must not empty a pool."""
        loop = asyncio.get_running_loop()
        for entry in self._registry.discovered:
            try:
                async with asyncio.timeout(self._config.timeout_s):
                    infos = await loop.getaddrinfo(entry.host, entry.port, type=socket.SOCK_STREAM)
            except (OSError, TimeoutError) as exc:
                log.warning("cannot resolve %s for pool %s: %s", entry.host, entry.pool, exc)
                continue
            addresses = sorted({str(info[4][0]) for info in infos})
            added, removed = self._registry.apply_discovery(entry, addresses)
            for backend in added:
                log.info("discovered backend %s (pool %s) at %s", backend.name, backend.pool, backend.url)
            for backend in removed:
                log.info("backend %s (pool %s) left DNS", backend.name, backend.pool)
                self.forget(backend)

    def forget(self, backend: Backend) -> None:
        """Drop a gone backend's series, so /metrics does not keep reporting it."""
        m = self._metrics
        for metric, labels in (
            (m.backend_up, (backend.pool, backend.name, backend.engine)),
            (m.scrape_age, (backend.pool, backend.name)),
        ):
            with contextlib.suppress(KeyError):
                metric.remove(*labels)
        for signal in ("running", "waiting", "kv_usage", "prefix_hit_rate"):
            with contextlib.suppress(KeyError):
                m.backend_load.remove(backend.pool, backend.name, backend.engine, signal)

    async def check_all(self) -> None:
        await self.discover()
        backends = list(self._registry)
        results = await asyncio.gather(*(self.check(b) for b in backends))
        for backend, ok in zip(backends, results, strict=True):
            if backend.retired:
                continue
            was = backend.healthy
            self._registry.record_check(backend, ok, time.monotonic())
            now = backend.healthy
            self._metrics.backend_up.labels(backend.pool, backend.name, backend.engine).set(1 if now else 0)
            if was != now:
                log.log(
                    logging.INFO if now else logging.WARNING,
                    "backend %s (%s) is now %s",
                    backend.name,
                    backend.pool,
                    "healthy" if now else "unhealthy",
                )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._config.interval_s)
            try:
                await self.check_all()
            except Exception:  # a bug here must not stop health checking for good
                log.exception("health check round failed")
