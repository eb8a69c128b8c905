"""gRPC's standard health service for `gateway epp`: "liveness" is serving while the process runs;
"readiness" and the empty service name (what Kubernetes' gRPC probe and grpc_health_probe ask by
default) are serving once some backend passed its health check (and every InferencePool's first
list of pods has been applied)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from gateway.epp.proto import health_pb2 as pb
from gateway.fleet.registry import Registry

SERVICE = "grpc.health.v1.Health"
WATCH_INTERVAL_S = 1.0


class Health:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def status(self, service: str) -> pb.HealthCheckResponse.ServingStatus | None:
        """The service's status; None for a service name this server does not know."""
        if service == "liveness":
            return pb.HealthCheckResponse.SERVING
        if service in ("", "readiness"):
            synced = self._registry.synced()
            ready = synced and any(b.healthy and not b.retired for b in self._registry)
            return pb.HealthCheckResponse.SERVING if ready else pb.HealthCheckResponse.NOT_SERVING
        return None

    async def check(
        self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service[:64]!r}")
        return pb.HealthCheckResponse(status=status)

    async def watch(
        self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.HealthCheckResponse]:
        """The status now, then each change (polled: the registry has no change callback)."""
        last: int = -1
        while True:
            status = self.status(request.service)
            current = pb.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status
            if current != last:
                last = current
                yield pb.HealthCheckResponse(status=current)
            await asyncio.sleep(WATCH_INTERVAL_S)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    self.check,
                    request_deserializer=pb.HealthCheckRequest.FromString,
                    response_serializer=pb.HealthCheckResponse.SerializeToString,
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self.watch,
                    request_deserializer=pb.HealthCheckRequest.FromString,
                    response_serializer=pb.HealthCheckResponse.SerializeToString,
                ),
            },
        )
