"""`gateway epp`: the gateway's routing served to Envoy as its ext_proc ExternalProcessor (gRPC), with
gRPC health beside it and the gateway's metrics page on a small HTTP listener. The gateway is built by
the one composition root (gateway/app/build.py), as `gateway serve` builds it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import grpc

from gateway.app.background import start_gateway, stop_gateway
from gateway.app.build import build
from gateway.config import GatewayConfig
from gateway.epp.health import Health
from gateway.epp.picker import Picker
from gateway.epp.processor import ExternalProcessor
from gateway.epp.proto import external_processor_pb2 as ep
from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
DEFAULT_PORT = 9002
GRACE_S = 5.0


class EppListenError(Exception):
    """The gRPC port could not be bound."""


def processor_handler(processor: ExternalProcessor) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Process": grpc.stream_stream_rpc_method_handler(
                processor.process,
                request_deserializer=ep.ProcessingRequest.FromString,
                response_serializer=ep.ProcessingResponse.SerializeToString,
            )
        },
    )


async def _metrics_page(metrics: GatewayMetrics, host: str, port: int) -> asyncio.Server:
    """GET /metrics (anything else: 404) on a plain asyncio listener: the EPP has no HTTP app."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
            if head.startswith(b"GET ") and path.split(b"?")[0] == b"/metrics":
                body, status = metrics.exposition(), b"200 OK"
            else:
                body, status = b"not found\n", b"404 Not Found"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, port)


async def run_epp(config: GatewayConfig, host: str, port: int, metrics_port: int | None) -> None:
    """Serve until SIGINT or SIGTERM; then stop taking streams, give the open ones GRACE_S, and stop."""
    gw = build(config)
    tasks = await start_gateway(gw)
    # A buffered body comes in one message: room for the largest body the gateway takes.
    size = config.limits.max_body_bytes + (1 << 16)
    server = grpc.aio.server(
        options=(
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", size),
            ("grpc.so_reuseport", 0),  # a second `gateway epp` on the port is an error, not a silent twin
        )
    )
    server.add_generic_rpc_handlers((processor_handler(ExternalProcessor(Picker(gw))), Health(gw.registry).handler()))
    page: asyncio.Server | None = None
    try:
        try:
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:
            raise EppListenError(f"port {port} is in use; pick another with --port") from exc
        if bound == 0:
            raise EppListenError(f"port {port} is in use; pick another with --port")
        await server.start()
        if metrics_port is not None:
            page = await _metrics_page(gw.metrics, host, metrics_port)
        ready = sum(1 for b in gw.registry if b.healthy)
        total = sum(1 for _ in gw.registry)
        metrics = f", metrics on http://{host}:{metrics_port}/metrics" if metrics_port is not None else ""
        log.info("gateway epp: ext_proc on %s:%d (%d of %d backends healthy)%s", host, port, ready, total, metrics)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        log.info("gateway epp: stopping (open streams get %.0f s)", GRACE_S)
    finally:
        if page is not None:
            page.close()
        with contextlib.suppress(Exception):
            await server.stop(GRACE_S)
        await stop_gateway(gw, tasks)
