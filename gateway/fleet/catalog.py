"""Model discovery: with each health round, ask every healthy backend what it serves (the engine
adapter's models_calls: /v1/models, and llama.cpp's /props for its window), keep it on the backend,
rebuild the registry's model index when something changed, and export it as
gateway_backend_model_info. A failed call keeps what was known."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from engines.base import ServedModel
from gateway.errors import GatewayError
from gateway.fleet.registry import Backend, Registry
from gateway.metrics import GatewayMetrics
from gateway.upstream.client import UpstreamClient

log = logging.getLogger(__name__)


class ModelCatalog:
    def __init__(self, registry: Registry, upstream: UpstreamClient, metrics: GatewayMetrics, timeout_s: float) -> None:
        self._registry = registry
        self._upstream = upstream
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._exported: dict[str, tuple[str, dict[str, float]]] = {}
        """backend name -> (pool, model -> window): the series gateway_backend_model_info holds."""
        self._members: tuple[tuple[str, tuple[str, ...], int | None], ...] = ()

    async def fetch(self, backend: Backend) -> tuple[ServedModel, ...] | None:
        """What the backend's engine says it serves, or None when it could not say."""
        answers: list[Any] = []
        for i, call in enumerate(backend.adapter.models_calls):
            try:
                status, data = await self._upstream.get_json(
                    backend.url + call.path, backend.auth_headers(), self._timeout_s, backend.name
                )
            except GatewayError:
                status, data = 0, None
            if status != 200 and i == 0:
                return None
            answers.append(data if status == 200 else None)
        return backend.adapter.parse_models(answers)

    async def refresh(self, backends: Sequence[Backend]) -> None:
        """Ask each of `backends` (the healthy ones) what it serves; rebuild the index on a change."""
        found = await asyncio.gather(*(self.fetch(b) for b in backends))
        for backend, served in zip(backends, found, strict=True):
            if served is not None and served != backend.served:
                before = backend.names
                backend.set_served(served)
                if backend.names != before:
                    log.info("backend %s (pool %s) serves %s", backend.name, backend.pool, ", ".join(backend.names))
        self.sync()

    def sync(self) -> None:
        """Rebuild the index and the metric when the members, their models or windows changed."""
        members = tuple((b.name, b.names, b.window) for b in self._registry)
        if members == self._members:
            return
        self._members = members
        self._registry.rebuild_models()
        current = {b.name: b for b in self._registry}
        for name in [n for n in self._exported if n not in current]:
            self._set(name, *self._exported[name][:1], {})
        for backend in current.values():
            self._set(backend.name, backend.pool, {m: float(_window(backend, m) or 0) for m in backend.names})

    def forget(self, backend: Backend) -> None:
        """Drop a gone backend's series."""
        self._set(backend.name, backend.pool, {})
        self._members = ()

    def _set(self, name: str, pool: str, series: dict[str, float]) -> None:
        """Make the backend's gateway_backend_model_info series exactly `series`."""
        _, old = self._exported.get(name, (pool, {}))
        for model in old.keys() - series.keys():
            with contextlib.suppress(KeyError):
                self._metrics.backend_model.remove(pool, name, model)
        for model, window in series.items():
            if old.get(model) != window:
                self._metrics.backend_model.labels(pool, name, model).set(window)
        if series:
            self._exported[name] = (pool, series)
        else:
            self._exported.pop(name, None)


def _window(backend: Backend, model: str) -> int | None:
    if backend.model or len(backend.names) == 1:
        return backend.window
    return next((m.window for m in backend.served if m.id == model), None)
