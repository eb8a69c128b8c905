"""Run a gateway app under uvicorn (uvloop + httptools) inside the current event loop, so that
`serve`, `demo` and the tests all start it the same way."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig


def uvicorn_config(config: GatewayConfig, host: str, port: int, platform: str | None = None,
                   log_level: str = "info") -> uvicorn.Config:
    return uvicorn.Config(
        create_app(config, platform), host=host, port=port, loop="uvloop", http="httptools",
        lifespan="on", access_log=False, log_level=log_level, log_config=None,
        timeout_graceful_shutdown=max(1, int(config.server.drain_timeout_s)), server_header=False,
        date_header=False, timeout_keep_alive=30,
    )


async def serve(config: GatewayConfig, host: str, port: int, platform: str | None = None,
                log_level: str = "info", started: asyncio.Event | None = None) -> None:
    server = uvicorn.Server(uvicorn_config(config, host, port, platform, log_level))
    task = asyncio.create_task(server.serve())
    if started is not None:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        started.set()
    await task


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
