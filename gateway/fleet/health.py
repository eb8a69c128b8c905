"""Backend health: the state machine (active check results, passive failures from the attempts,
slow-start re-admission) and the active checker, an asyncio task started in lifespan that polls
each backend's health path (and refreshes DNS discovery) every round."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gateway.config import HealthConfig
from gateway.errors import GatewayError
from gateway.fleet.catalog import ModelCatalog
from gateway.fleet.discovery import apply_discovery, resolve
from gateway.fleet.registry import Backend, Registry
from gateway.metrics import GatewayMetrics
from gateway.upstream.client import UpstreamClient

log = logging.getLogger(__name__)


class HealthState:
    """How results move a backend between healthy and not. Passive: connect errors and 5xx count,
    a 4xx is the client's fault, not the backend's."""

    def __init__(self, config: HealthConfig) -> None:
        self._config = config

    def record_failure(self, backend: Backend) -> bool:
        """Returns True when this failure ejected the backend."""
        backend.consecutive_failures += 1
        if backend.healthy and backend.consecutive_failures >= self._config.unhealthy_after:
            backend.healthy = False
            return True
        return False

    def record_success(self, backend: Backend) -> None:
        backend.consecutive_failures = 0

    def set_health(self, backend: Backend, healthy: bool, now: float | None = None) -> None:
        if healthy and not backend.healthy:
            backend.consecutive_failures = 0
            if backend.checked and now is not None:  # back from an outage (not the first admission)
                backend.readmitted_at = now
        backend.checked = True
        backend.healthy = healthy

    def record_check(self, backend: Backend, ok: bool, now: float | None = None) -> None:
        """One active health check's result. A backend never checked before takes the result at once
        (start-up); a healthy one is marked down only after `failed_checks` failures in a row."""
        if ok:
            backend.failed_checks = 0
            self.set_health(backend, True, now)
            return
        backend.failed_checks += 1
        if not backend.checked or not backend.healthy or backend.failed_checks >= self._config.failed_checks:
            self.set_health(backend, False)


class PassiveHealth:
    """What the serving path reports about a backend: each failure that is the backend's (counted
    under its kind in gateway_upstream_errors_total, and towards ejection), and each whole answer."""

    def __init__(self, state: HealthState, metrics: GatewayMetrics) -> None:
        self._state = state
        self._metrics = metrics

    def failure(self, backend: Backend, kind: str, penalise: bool = True) -> None:
        self._metrics.upstream_errors.labels(backend.pool, backend.name, kind).inc()
        if penalise and self._state.record_failure(backend):
            self._metrics.backend_up.labels(backend.pool, backend.name, backend.engine).set(0)

    def success(self, backend: Backend) -> None:
        """A whole answer reached the client: only then does the failure count start again."""
        self._state.record_success(backend)


class HealthChecker:
    def __init__(
        self,
        registry: Registry,
        state: HealthState,
        upstream: UpstreamClient,
        metrics: GatewayMetrics,
        config: HealthConfig,
        catalog: ModelCatalog | None = None,
    ) -> None:
        self._registry = registry
        self._catalog = catalog or ModelCatalog(registry, upstream, metrics, config.timeout_s)
        self._state = state
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
        for entry in self._registry.discovered:
            addresses = await resolve(entry, self._config.timeout_s)
            if addresses is None:
                continue
            added, removed = apply_discovery(self._registry, entry, addresses)
            for backend in added:
                log.info("discovered backend %s (pool %s) at %s", backend.name, backend.pool, backend.url)
            for backend in removed:
                log.info("backend %s (pool %s) left DNS", backend.name, backend.pool)
                self.forget(backend)

    def forget(self, backend: Backend) -> None:
        """Drop a gone backend's series, so /metrics does not keep reporting it."""
        m = self._metrics
        self._catalog.forget(backend)
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
        await self.check_some(list(self._registry))

    async def check_some(self, backends: list[Backend]) -> None:
        """Check these backends now and ask the healthy ones what they serve (new members need not
        wait for the next round)."""
        results = await asyncio.gather(*(self.check(b) for b in backends))
        for backend, ok in zip(backends, results, strict=True):
            if backend.retired:
                continue
            was = backend.healthy
            self._state.record_check(backend, ok, time.monotonic())
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
        # What each healthy engine serves, every round: an engine restarted with another model is seen.
        await self._catalog.refresh([b for b in backends if b.healthy and not b.retired and b.discover_models])

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._config.interval_s)
            try:
                await self.check_all()
            except Exception:  # a bug here must not stop health checking for good
                log.exception("health check round failed")
