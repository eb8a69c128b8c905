"""Engine-load scraping: an asyncio task that reads each backend's /metrics through its engine
adapter into an EngineLoad, and re-exports it as gateway_backend_load under our own names."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.config import HealthConfig
from gateway.errors import GatewayError
from gateway.fleet.registry import Backend, Registry
from gateway.metrics import GatewayMetrics
from gateway.upstream.client import UpstreamClient

log = logging.getLogger(__name__)


class LoadScraper:
    def __init__(
        self, registry: Registry, upstream: UpstreamClient, metrics: GatewayMetrics, config: HealthConfig
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._metrics = metrics
        self._config = config
        self._refused: set[str] = set()  # backends told about once, until a scrape works again

    async def scrape(self, backend: Backend) -> None:
        path = backend.adapter.metrics_path
        if not path:
            return
        headers = backend.auth_headers()
        try:
            status, raw = await self._upstream.get(backend.url + path, headers, self._config.timeout_s, backend.name)
        except GatewayError:
            return
        if status != 200:
            if backend.name not in self._refused:
                self._refused.add(backend.name)
                log.warning(
                    "backend %s (%s): GET %s answered %d, so its load is not scraped and the balancer uses the"
                    " gateway's own in-flight count (llama-server needs --metrics, SGLang --enable-metrics)",
                    backend.name,
                    backend.engine,
                    path,
                    status,
                )
            return
        self._refused.discard(backend.name)
        load = backend.adapter.parse_load(raw.decode("utf-8", "replace"), time.monotonic())
        self._registry.set_load(backend, load)
        for signal, value in load.signals().items():
            self._metrics.backend_load.labels(backend.pool, backend.name, backend.engine, signal).set(value)

    def export_ages(self) -> None:
        now = time.monotonic()
        for backend in self._registry:
            if backend.load is not None:
                self._metrics.scrape_age.labels(backend.pool, backend.name).set(now - backend.load.scraped_at)

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(b) for b in self._registry if b.healthy))
        self.export_ages()

    async def run(self) -> None:
        while True:
            try:
                await self.scrape_all()
            except Exception:  # keep scraping whatever one round did
                log.exception("load scrape round failed")
            await asyncio.sleep(self._config.scrape_interval_s)
