"""Run a gateway app under uvicorn (uvloop + httptools) inside the current event loop, so that
`serve`, `demo` and the tests all start it the same way."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
import sys
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn

from gateway import accesslog
from gateway.app.banner import model_lines
from gateway.app.build import GatewayApp, create_app
from gateway.app.instance import Gateway
from gateway.app.routes import model_entries
from gateway.config import GatewayConfig
from gateway.config_loader import ConfigError, load_config
from gateway.policy.rules import Platform
from gateway.serving.protocol import protocol_class

log = logging.getLogger(__name__)


class ListenError(Exception):
    """The gateway could not listen where it was told to; the message is one line for the user."""


def listen_socket(host: str, port: int) -> socket.socket:
    """Bind host:port before anything starts, so that a taken port is one clear error (uvicorn
    logs the OSError and exits 3 from inside its startup, which asyncio prints as a traceback)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(port_in_use(port)) from None
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def port_in_use(port: int) -> str:
    return f"port {port} is in use; pick another with --port"


class GatewayServer(uvicorn.Server):
    """uvicorn, plus: the first SIGTERM/SIGINT marks the gateway draining (readiness fails at once)
    before uvicorn stops accepting connections and waits up to drain_timeout_s for requests; and
    SIGHUP reloads the config file, when there is one (an invalid file keeps the running config)."""

    def __init__(self, config: uvicorn.Config, config_path: str | None = None) -> None:
        super().__init__(config)
        self.config_path = config_path
        self._reloads: set[asyncio.Task[bool]] = set()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        hup = self.config_path is not None and threading.current_thread() is threading.main_thread()
        if hup:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_hup)
        try:
            await super().serve(sockets)
        finally:
            if hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    def _on_hup(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload_from_file(), name="reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def reload_from_file(self) -> bool:
        """Load the config file again and swap it in; False (and the old config kept) if invalid."""
        assert self.config_path is not None
        try:
            config = load_config(self.config_path)
        except ConfigError as exc:
            log.error("reload of %s refused, the running config stays: %s", self.config_path, "; ".join(exc.problems))
            return False
        app = self.config.loaded_app
        while not isinstance(app, GatewayApp):
            app = app.app
        await app.reload(config)
        return True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        app = self.config.loaded_app
        while app is not None and not hasattr(app, "state"):
            app = getattr(app, "app", None)
        if app is not None:
            app.state.gateway.lifecycle.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """As uvicorn's; but after a second Ctrl-C (a forced exit), where uvicorn leaves the requests
        and the lifespan running for asyncio.run to cancel (one traceback each, and streams cut with
        no word), cancel the requests here, so that each client is told the gateway is shutting
        down, and run the lifespan shutdown, both bounded."""
        await super().shutdown(sockets)
        if not self.force_exit:
            return
        tasks = list(self.server_state.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await self.lifespan.shutdown()

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


def uvicorn_config(
    config: GatewayConfig, host: str, port: int, platform: Platform | None = None, log_level: str = "info"
) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(config, platform),
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_class(config.server.request_timeout_s, config.limits.max_header_bytes, config.limits.max_headers),
        lifespan="on",
        access_log=False,
        log_level=log_level,
        log_config=None,
        timeout_graceful_shutdown=max(1, int(config.server.drain_timeout_s)),
        server_header=False,
        date_header=False,
        timeout_keep_alive=30,
        proxy_headers=False,
    )


async def serve(
    config: GatewayConfig,
    host: str,
    port: int,
    platform: Platform | None = None,
    log_level: str = "info",
    started: asyncio.Event | None = None,
    config_path: str | None = None,
) -> None:
    sock = listen_socket(host, port)
    server = GatewayServer(uvicorn_config(config, host, port, platform, log_level), config_path)
    task = asyncio.create_task(server.serve([sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        shown = f"[{host}]" if ":" in host else host
        log.info("gateway listening on http://%s:%d (Ctrl-C to stop)", shown, sock.getsockname()[1])
        _log_models(uvicorn_app(server))
    tune_gc()
    if started is not None:
        started.set()
    await task


def uvicorn_app(server: uvicorn.Server) -> Any:
    """The GatewayApp inside uvicorn's wrappers."""
    app = server.config.loaded_app
    while not hasattr(app, "state"):
        app = app.app
    return app


def _log_models(app: Any) -> None:
    """Once the first health round is done: each model found and where it routes, one line each."""
    gw = app.state.gateway
    listed = list(model_entries(gw.config, gw.registry, gw.router.names, 0))
    for line in model_lines(gw.registry, gw.router, listed):
        log.info("model %s", line)


@dataclass
class Running:
    """A gateway serving in the current loop (tests, benchmarks, tools): where, and how to stop."""

    server: GatewayServer
    task: asyncio.Task[None]
    port: int
    gateway: Gateway

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


async def start(
    config: GatewayConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    platform: Platform | None = None,
    log_level: str = "warning",
    timeout_s: float = 10.0,
) -> Running:
    """Start serving in this loop and return once the socket listens (port 0 picks a free one)."""
    uv = uvicorn_config(config, host, port, platform, log_level)
    server = GatewayServer(uv)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(timeout_s):
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the gateway stopped before it started")
            await asyncio.sleep(0.005)
    app = uvicorn_app(server)
    return Running(server, task, server.servers[0].sockets[0].getsockname()[1], app.state.gateway)


def tune_gc() -> None:
    """Everything built at start-up lives for the whole process: freeze it out of the collector's
    sight, and collect young objects less often. Measured (benchmarks/overhead): full collections
    every ~1,300 requests stalled every request in flight for ~20 ms, and freed almost nothing."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


def run(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run on uvloop where it exists. uvicorn's loop="uvloop" only applies in its own
    Server.run(), not when serve() is awaited inside a loop the caller made, as here."""
    try:
        import uvloop
    except ImportError:  # Windows: the standard loop
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def configure_logging(level: str) -> None:
    fmt = "%(asctime)s %(levelname)s %(name)s %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt)
    accesslog.install(sys.stderr, fmt)
