"""The gateway's HTTP surface: thin Starlette endpoints for models, health, readiness, metrics and
the OpenAPI description, the raw-ASGI completion endpoints, and OpenAI-shaped 404/405 bodies."""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.access.gate import AccessGate
from gateway.access.keys import ClientKey
from gateway.app.openapi import openapi_bytes
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, MethodNotAllowed, ModelNotFound, NotFound
from gateway.fleet.registry import Backend, Registry
from gateway.fleet.scraper import LoadScraper
from gateway.metrics import GatewayMetrics
from gateway.pipeline.endpoint import CompletionEndpoint
from gateway.pipeline.lifecycle import Lifecycle
from gateway.policy.models import ModelNames

_GZIP_MIN = 4096
"""A smaller page is sent as it is: compressing it saves less than it costs."""


def error_response(err: GatewayError) -> Response:
    return Response(err.body_bytes(), status_code=err.status_code, media_type="application/json", headers=err.headers())


class Endpoints:
    def __init__(
        self,
        config: GatewayConfig,
        registry: Registry,
        metrics: GatewayMetrics,
        scraper: LoadScraper,
        lifecycle: Lifecycle,
        access: AccessGate,
        exemplars: bool = False,
    ) -> None:
        self._config = config
        self._exemplars = exemplars
        """Tracing is on: a scrape that asks for OpenMetrics gets it, with the trace ids as exemplars."""
        self._lifecycle = lifecycle
        self._access = access
        self._registry = registry
        self._metrics = metrics
        self._scraper = scraper
        self._created = int(time.time())
        self._openapi = openapi_bytes(config.limits)
        self._names = ModelNames(config)

    def model_list(self) -> dict[str, dict[str, Any]]:
        return model_entries(self._config, self._registry, self._names, self._created)

    def _client(self, request: Request) -> ClientKey | None:
        return self._access.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))

    async def models(self, request: Request) -> Response:
        try:
            client = self._client(request)
        except GatewayError as err:
            return error_response(err)
        data = [e for m, e in self.model_list().items() if client is None or client.allows(m)]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id}: one entry (ids may hold slashes), or OpenAI's 404."""
        try:
            client = self._client(request)
        except GatewayError as err:
            return error_response(err)
        model = request.path_params["model"]
        if not model:  # /v1/models/ is no endpoint (and never a redirect: open redirect)
            return error_response(NotFound(f"No such endpoint: {request.url.path}."))
        entry = self.model_list().get(model)
        if entry is None or (client is not None and not client.allows(model)):
            shown = model if len(model) <= 64 else model[:64] + "..."
            return error_response(ModelNotFound(f"The model '{shown}' does not exist.", param="model"))
        return JSONResponse(entry)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        healthy = [b.name for b in self._registry if b.healthy]
        ready = bool(healthy) and not self._lifecycle.draining and self._registry.synced()
        return JSONResponse(
            {
                "ready": ready,
                "draining": self._lifecycle.draining,
                "healthy_backends": len(healthy),
                "backends": len(self._registry.by_name),
            },
            status_code=200 if ready else 503,
        )

    async def metrics(self, request: Request) -> Response:
        """The exposition, rendered a piece at a time with the event loop let run between pieces
        (streams wait ~1 ms at most, not the whole render's 4-9 ms), and gzipped (level 1, in a
        thread: zlib lets go of the GIL) when the scraper accepts it, as Prometheus does."""
        self._scraper.export_ages()
        openmetrics = self._exemplars and "application/openmetrics-text" in request.headers.get("accept", "")
        media_type = OPENMETRICS_TYPE if openmetrics else CONTENT_TYPE_LATEST
        parts: list[bytes] = []
        for part in self._metrics.exposition_parts(openmetrics):
            parts.append(part)
            await asyncio.sleep(0)
        body = b"".join(parts)
        if "gzip" not in request.headers.get("accept-encoding", "") or len(body) < _GZIP_MIN:
            return Response(body, media_type=media_type)
        packed = await asyncio.to_thread(zlib.compress, body, 1, 31)  # wbits 31: the gzip format
        return Response(packed, media_type=media_type, headers={"content-encoding": "gzip", "vary": "accept-encoding"})

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    def routes(self, completions: list[CompletionEndpoint]) -> list[BaseRoute]:
        out: list[BaseRoute] = [Route(e.path, e, methods=["POST"]) for e in completions]
        out += [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/health", self.healthz, methods=["GET"]),  # vLLM's and SGLang's name; guidellm checks it
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]
        return out


def model_entries(
    config: GatewayConfig, registry: Registry, names: ModelNames, created: int
) -> dict[str, dict[str, Any]]:
    """Every name a client may pick, once each: the routes' exact names, the aliases, then each
    model a backend serves (its `model:`, else what its engine listed) that some route takes, in
    OpenAI's shape, with `max_model_len` (the smallest window among the backends that serve it)
    where one is known."""

    def entry(model: str, owner: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": created, "owned_by": owner}

    found: dict[str, dict[str, Any]] = {}
    for backend in registry:
        for model in backend.names:
            if names.resolve(model) is None:  # served, but no route takes this name: not the client's
                continue
            item = found.setdefault(model, entry(model, _owner(backend, model)))
            if backend.window is not None:
                item["max_model_len"] = min(item.get("max_model_len", backend.window), backend.window)
    out: dict[str, dict[str, Any]] = {}
    for route in config.routes:
        if not route.is_glob:
            out.setdefault(route.model, found.get(route.model) or entry(route.model, "gateway"))
    for alias, target in names.aliases().items():
        if alias not in out:
            out[alias] = {**(found.get(target) or entry(target, "gateway")), "id": alias}
    for model, item in found.items():
        out.setdefault(model, item)
    return out


def _owner(backend: Backend, model: str) -> str:
    """Who the engine says owns the model (vLLM: "vllm"), else the engine kind."""
    return next((m.owned_by for m in backend.served if m.id == model), backend.engine)


async def http_exception(request: Request, exc: Any) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return error_response(MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}."))
    if exc.status_code == 404:
        return error_response(NotFound(f"No such endpoint: {request.url.path}."))
    return error_response(GatewayError(str(exc.detail), status=exc.status_code))
