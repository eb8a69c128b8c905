"""One HTTP/1.1 connection to a backend: an asyncio Protocol that writes a request and parses the
answer with httptools' response parser (the C parser uvicorn uses inbound), buffering the body for
the reader with back-pressure. `pool.py` keeps these alive between requests.

Why not aiohttp's client any more: on the overhead benchmark it was the largest single item of the
gateway's CPU per proxied request (20-27 %), more than all the gateway's routing; this does the same
job for the one kind of request the gateway makes (a request with a known-length body, an answer
read to its end or abandoned) in a fraction of it (docs/benchmarks.md gives the figures)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import cast

import httptools

HIGH_WATER = 256 * 1024
"""Unread body bytes at which the connection stops reading from the socket (it reads again once the
reader has taken them), so that a slow client holds the backend up through TCP rather than the
gateway's memory (aiohttp's StreamReader did the same at 128 KiB)."""


class ConnectionClosed(Exception):
    """The backend closed the connection (or it failed) before the answer was complete."""


class TimedOut(Exception):
    """The caller's limit for the answer's head passed (`time_out()`)."""


class BadResponse(Exception):
    """The backend's bytes are not an HTTP/1.1 response."""


class UpstreamConnection:
    """A keep-alive connection; one request at a time. `request()` writes it; `wait_head()`,
    `read_chunk()` and `complete` read the answer; `reusable` says whether it can serve another.

    It has asyncio.Protocol's methods without subclassing it (the loop calls them by name): a
    subclass of a Python class compiles (mypyc) to a type that keeps an instance `__dict__` and
    does not clear weak references to itself when freed, which crashed the interpreter."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        """The loop it runs on (asyncio.get_running_loop() costs a getpid() syscall a call on CPython 3.11)."""
        self.transport: asyncio.Transport | None = None
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        """Holds this protocol for its callbacks: dropped when the connection is lost, so that a closed
        connection is freed at once rather than left as a cycle for a full collection (the gateway's
        GC runs those minutes apart: 1,000 streams left 4 MiB each time)."""
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: deque[bytes] = deque()
        self.buffered = 0
        """Body bytes received and not yet read."""
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._head_done = False
        self.complete = False
        """The whole answer has been received."""
        self._until_close = False
        self._interim = False
        self._paused = False
        self._keep_alive = False
        self.closed = False
        self.received = False
        """Some byte of an answer came on this connection since its last request."""
        self.error: Exception | None = None
        self.idle_since = 0.0
        self.sink: Callable[[bytes], bool] | None = None
        """Takes each body chunk as it is parsed, in place of the buffer and a wake of the reader
        (`splice()`), until it returns False: it took that chunk, and stepped back."""
        self.on_lost: list[UpstreamConnection] | None = None
        """The pool's idle list this connection sits in, if any (it leaves it when it closes)."""
        self.opened: set[UpstreamConnection] | None = None
        """The pool's set of open connections, which it leaves when it is lost."""

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, though not a subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        parser = self._parser
        if parser is None:
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(BadResponse("the backend switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"the backend's response is not valid HTTP/1.1 ({exc})"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._parser = None
        if self.opened is not None:
            self.opened.discard(self)
            self.opened = None
        if self.on_lost is not None:
            idle, self.on_lost = self.on_lost, None
            if self in idle:
                idle.remove(self)
        if not self.complete and self.error is None:
            if self._head_done and self._until_close:
                self.complete = True  # no length and not chunked: the body ends at the close
            else:
                self.error = ConnectionClosed("the backend closed the connection")
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # called by the parser itself
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._raw_headers = []  # an interim answer (103 Early Hints...): the final one follows
            self._interim = True
            return
        self.status = status
        headers: dict[str, str] = {}
        for name, value in self._raw_headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.headers = headers
        self._keep_alive = parser.should_keep_alive()
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._until_close = "content-length" not in headers and not chunked and status not in (204, 304)
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            if not sink(body):
                self.sink = None
                self._wake()
            return
        self._chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True
        self._wake()

    # -- the request -------------------------------------------------------------------------------

    async def request(self, head: bytes, body: bytes) -> None:
        """Write one request (its head already encoded), waiting only if the socket is full."""
        transport = self.transport
        if self.closed or transport is None:
            raise ConnectionClosed("the connection closed before the request was sent")
        if body and len(body) < 64 * 1024:
            transport.write(head + body)
        else:
            transport.write(head)
            if body:
                transport.write(body)
        if self._drain is not None and not self._drain.done():
            await self._drain
            if self.error is not None:
                raise self.error

    async def wait_head(self) -> None:
        """Until the status line and headers are in (the caller bounds the wait)."""
        while not self._head_done:
            if self.error is not None:
                raise self.error
            await self._wait()

    def take(self) -> bytes:
        """Every body byte buffered now (b"" if none)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks.popleft() if len(chunks) == 1 else b"".join([chunks.popleft() for _ in range(len(chunks))])
        self.buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def read_chunk(self) -> bytes:
        """The body bytes buffered, waiting for some if there are none; b"" at the body's end."""
        while not self._chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait()
        return self.take()

    def splice(self, sink: Callable[[bytes], bool]) -> bool:
        """Hand each later body chunk to `sink`, in the parser's callback, until it returns False;
        False, attaching nothing, when chunks are already waiting or the answer is over (read them)."""
        if self._chunks or self.complete or self.error is not None or self.closed:
            return False
        self.sink = sink
        return True

    async def wait_spliced(self) -> None:
        """Until the sink steps back or the answer ends or fails (read_chunk() then says which);
        the sink is detached however this ends, a cancellation included."""
        try:
            while self.sink is not None and not self.complete and self.error is None:
                await self._wait()
        finally:
            self.sink = None

    @property
    def reusable(self) -> bool:
        """Whether the answer was read whole and the connection may serve the next request."""
        return self.complete and self._keep_alive and not self.closed and not self._chunks

    def reset(self) -> None:
        """Ready for the next request on this connection (after a complete answer)."""
        self._raw_headers = []
        self._head_done = self.complete = self.received = False
        self.status = 0
        self.headers = {}

    def time_out(self) -> None:
        """The head-wait limit passed: fail the wait with TimedOut and drop the connection (a
        deadline calls this; a head that came in the same loop turn wins)."""
        if not self._head_done:
            self._fail(TimedOut("the backend did not answer in time"))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    # -- internals ---------------------------------------------------------------------------------

    async def _wait(self) -> None:
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        """Fail whatever waits with exc and drop the connection at once: abort, not close, which
        would wait for a write buffer the backend may never read."""
        self.error = exc
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
