"""A raw-bytes TCP server on 127.0.0.1 for the upstream client's tests: it tracks the connections it
accepted and their tasks, turns a failure inside a handler into a test failure at `stop()`, and ends
quietly when the client goes away. Subclasses say what a connection gets (`handle`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeVar

from gateway.config import TimeoutsConfig
from gateway.upstream.client import UpstreamClient


class RawServer:
    quiet: tuple[type[BaseException], ...] = (asyncio.IncompleteReadError, ConnectionError)
    """Errors that mean the client went away: the handler's loop just ends."""
    settle = 1
    """Loop turns `stop()` waits for the closed transports to finish closing (TLS needs more)."""

    def __init__(self) -> None:
        self.connections = 0
        """Connections accepted (for TLS: whose handshake completed)."""
        self.errors: list[BaseException] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def listen(self, context: ssl.SSLContext | None = None) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        raise NotImplementedError

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.append(writer)
        index = self.connections
        self.connections += 1
        try:
            await self.handle(reader, writer, index)
        except self.quiet:
            pass  # the client went away: the handler's loop ends
        except asyncio.CancelledError:
            pass  # stop() ends a handler still waiting (asyncio logs a task that ends cancelled)
        except BaseException as exc:  # a failed assertion in a handler fails the test at stop()
            self.errors.append(exc)
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current and not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        for _ in range(self.settle):
            await asyncio.sleep(0)  # let the closed transports finish closing
        assert not self.errors, self.errors


class Startable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Startable)


@contextlib.asynccontextmanager
async def serving(server: S, first_byte_s: float) -> AsyncIterator[tuple[S, UpstreamClient]]:
    """The started server and a fresh client, both closed after; the whole test within 5 s."""
    async with asyncio.timeout(5):
        await server.start()
        client = UpstreamClient(TimeoutsConfig(connect_s=2.0, first_byte_s=first_byte_s))
        await client.start()
        try:
            yield server, client
        finally:
            await client.close()
            await server.stop()
