"""The gateway's HTTP surface: thin Starlette endpoints for models, health, readiness, metrics and
the OpenAPI description, the raw-ASGI completion endpoints, and OpenAI-shaped 404/405 bodies."""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.access.gate import AccessGate
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, MethodNotAllowed, NotFound
from gateway.fleet.registry import Registry
from gateway.fleet.scraper import LoadScraper
from gateway.metrics import GatewayMetrics
from gateway.pipeline.endpoint import CompletionEndpoint
from gateway.serving.lifecycle import Lifecycle
from gateway.serving.openapi import openapi_bytes

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
    ) -> None:
        self._config = config
        self._lifecycle = lifecycle
        self._access = access
        self._registry = registry
        self._metrics = metrics
        self._scraper = scraper
        self._created = int(time.time())
        self._openapi = openapi_bytes(config.limits)

    async def models(self, request: Request) -> Response:
        try:
            client = self._access.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
        except GatewayError as err:
            return error_response(err)
        data = [
            {"id": r.model, "object": "model", "created": self._created, "owned_by": "gateway"}
            for r in self._config.routes
            if not r.is_glob and (client is None or client.allows(r.model))
        ]
        return JSONResponse({"object": "list", "data": data})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        healthy = [b.name for b in self._registry if b.healthy]
        ready = bool(healthy) and not self._lifecycle.draining
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
        parts: list[bytes] = []
        for part in self._metrics.exposition_parts():
            parts.append(part)
            await asyncio.sleep(0)
        body = b"".join(parts)
        if "gzip" not in request.headers.get("accept-encoding", "") or len(body) < _GZIP_MIN:
            return Response(body, media_type=CONTENT_TYPE_LATEST)
        packed = await asyncio.to_thread(zlib.compress, body, 1, 31)  # wbits 31: the gzip format
        return Response(
            packed, media_type=CONTENT_TYPE_LATEST, headers={"content-encoding": "gzip", "vary": "accept-encoding"}
        )

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    def routes(self, completions: list[CompletionEndpoint]) -> list[BaseRoute]:
        out: list[BaseRoute] = [Route(e.path, e, methods=["POST"]) for e in completions]
        out += [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/health", self.healthz, methods=["GET"]),  # vLLM's and SGLang's name; guidellm checks it
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]
        return out


async def http_exception(request: Request, exc: Any) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return error_response(MethodNotAllowed(f"Method {request.method} is not allowed on {request.url.path}."))
    if exc.status_code == 404:
        return error_response(NotFound(f"No such endpoint: {request.url.path}."))
    return error_response(GatewayError(str(exc.detail), status=exc.status_code))
