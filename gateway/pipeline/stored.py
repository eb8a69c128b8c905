"""GET /v1/responses/{id} and POST /v1/responses/{id}/cancel: sent to the backend that answered with
that id (the response store), past the balancer; OpenAI's 404 when the id is unknown, forgotten past
the store's bound, or its backend has left the fleet. Engine errors come back OpenAI-shaped."""

from __future__ import annotations

import itertools
import json

from starlette.requests import Request
from starlette.responses import Response

from gateway.access.gate import AccessGate
from gateway.errors import EngineError, GatewayError, NoHealthyBackend
from gateway.fleet.registry import Registry
from gateway.pipeline.headers import for_backend, upstream_headers
from gateway.protocols.response_store import ResponseStore, not_found_body
from gateway.upstream.client import UpstreamClient

_MAX_BYTES = 16 << 20


def _error(err: GatewayError) -> Response:
    return Response(err.body_bytes(), status_code=err.status_code, media_type="application/json", headers=err.headers())


class StoredResponses:
    """The two by-id endpoints; the store is the one CompletionEndpoint fills from each answer."""

    def __init__(
        self, access: AccessGate, pins: ResponseStore, registry: Registry, upstream: UpstreamClient, timeout_s: float
    ) -> None:
        self._access = access
        self._pins = pins
        self._registry = registry
        self._upstream = upstream
        self._timeout_s = timeout_s
        self._ids = itertools.count(1)

    async def get(self, request: Request) -> Response:
        return await self._forward(request, cancel=False)

    async def cancel(self, request: Request) -> Response:
        return await self._forward(request, cancel=True)

    async def _forward(self, request: Request, cancel: bool) -> Response:
        try:
            self._access.authenticate(request.headers.get("authorization"))
        except GatewayError as err:
            return _error(err)
        response_id = str(request.path_params["response_id"])[:200]
        name = self._pins.get(response_id)
        backend = self._registry.by_name.get(name) if name is not None else None
        if backend is None or backend.retired:
            body = json.dumps(not_found_body(response_id, "response_id")).encode()
            return Response(body, status_code=404, media_type="application/json")
        if not backend.healthy:
            return _error(NoHealthyBackend(f"Backend {backend.name} is unavailable.", retry_after=5))
        path = f"/v1/responses/{response_id}" + ("/cancel" if cancel else "")
        query = request.url.query
        url = backend.url + path + (f"?{query}" if query and not cancel else "")
        request_id = request.headers.get("x-request-id") or f"stored-{next(self._ids):08x}"
        headers = for_backend(upstream_headers(dict(request.headers), request_id[:128]), backend)
        headers.pop("content-length", None)
        try:
            if cancel:
                resp = await self._upstream.post(url, b"", headers, backend.name, self._timeout_s)
                status, raw = resp.status, await resp.read(self._timeout_s, _MAX_BYTES)
                resp.release()
            else:
                status, raw = await self._upstream.get(url, headers, self._timeout_s, backend.name, _MAX_BYTES)
        except GatewayError as err:
            return _error(err)
        if status == 200:
            return Response(raw, status_code=200, media_type="application/json")
        norm = backend.adapter.normalise_error(status, raw)
        if status == 404:  # the engine forgot it (restarted, or its store is off): the gateway forgets too
            self._pins.forget(response_id)
        return _error(EngineError(norm.message, status=norm.status, type_=norm.type, code=norm.code, param=norm.param))
