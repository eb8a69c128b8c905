"""Run a gateway app under uvicorn (uvloop + httptools) inside the current event loop, so that
`serve`, `demo` and the tests all start it the same way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.rules import Platform


class GatewayServer(uvicorn.Server):
    """uvicorn, plus: the first SIGTERM/SIGINT marks the gateway draining (readiness fails at once)
    before uvicorn stops accepting connections and waits up to drain_timeout_s for requests."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        app = self.config.loaded_app
        while app is not None and not hasattr(app, "state"):
            app = getattr(app, "app", None)
        if app is not None:
            app.state.gateway.lifecycle.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, but a drained shutdown is a normal exit: the signal is not re-raised
        afterwards, so `gateway serve` exits 0 after SIGTERM (uvicorn's would die of the signal)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def uvicorn_config(config: GatewayConfig, host: str, port: int, platform: Platform | None = None,
                   log_level: str = "info") -> uvicorn.Config:
    return uvicorn.Config(
        create_app(config, platform), host=host, port=port, loop="uvloop", http="httptools",
        lifespan="on", access_log=False, log_level=log_level, log_config=None,
        timeout_graceful_shutdown=max(1, int(config.server.drain_timeout_s)), server_header=False,
        date_header=False, timeout_keep_alive=30,
    )


async def serve(config: GatewayConfig, host: str, port: int, platform: Platform | None = None,
                log_level: str = "info", started: asyncio.Event | None = None) -> None:
    server = GatewayServer(uvicorn_config(config, host, port, platform, log_level))
    task = asyncio.create_task(server.serve())
    if started is not None:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        started.set()
    await task


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
