"""The ASGI types, declared once for the whole gateway (they are starlette's own), and the scope
keys the gateway's server adds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "ARRIVED",
    "BODY_WRITER",
    "CLIENT_GONE",
    "LOOP",
    "ASGIApp",
    "ChunkWriter",
    "ClientGone",
    "Message",
    "Receive",
    "Scope",
    "Send",
]

ARRIVED = "gateway.arrived"
"""`time.perf_counter()` when the request's first byte was parsed (serving/protocol.py sets it; the
endpoint starts the request's clock there)."""

CLIENT_GONE = "gateway.client_gone"
"""A `ClientGone` hook (serving/protocol.py sets it): the endpoint hands it a callback for the moment
the client's connection is lost before its response is complete, instead of a task that waits on
`receive()` for `http.disconnect` (which it still runs under another server)."""


LOOP = "gateway.loop"
"""The event loop the request runs on (serving/protocol.py sets it): `asyncio.current_task(loop)`
with it is a dict lookup, where `asyncio.current_task()` first asks for the running loop, which on
CPython 3.11 makes a getpid() syscall each time."""

BODY_WRITER = "gateway.body_writer"
"""A `ChunkWriter` for the rest of the response's body, which the server's cycle (serving/cycle.py)
puts in the scope once the head is out with chunked framing: the relay then writes a stream's
middle from the upstream connection's callback, with no coroutine and no task wake a chunk. Absent
before, for other framings, and under another server: every chunk then goes through `send`."""


_CHUNK_HEADS: Final = [b"%x\r\n" % n for n in range(4096)]
"""Chunk-size lines by length: a lookup and two joins cost half what formatting each chunk did."""


class ChunkWriter:
    """What `send` does with a body message of a chunked response that has more to follow, done
    at once on the connection's transport: `write(body)` returns False, writing nothing, where
    `send` would wait first (the client's socket is full: flow control) or drop it (the client is
    gone)."""

    __slots__ = ("_flow", "_transport")

    def __init__(self, transport: Any, flow: Any) -> None:
        self._transport = transport
        self._flow = flow
        """uvicorn's FlowControl: `write_paused` while the transport is above its high-water mark."""

    def write(self, body: bytes) -> bool:
        if self._flow.write_paused or self._transport.is_closing():
            return False
        if body:
            n = len(body)
            head = _CHUNK_HEADS[n] if n < 4096 else b"%x\r\n" % n
            self._transport.write(head + body + b"\r\n")
        return True


class ClientGone:
    """`watch(callback)` calls it once when the connection is lost mid-request (at once, if it
    already was); `unwatch(callback)` forgets it (the request is over)."""

    __slots__ = ("_callback", "_lost")

    def __init__(self) -> None:
        self._callback: Callable[[], None] | None = None
        self._lost = False

    def watch(self, callback: Callable[[], None]) -> None:
        if self._lost:
            callback()
        else:
            self._callback = callback

    def unwatch(self, callback: Callable[[], None]) -> None:
        if self._callback is callback:
            self._callback = None

    def lost(self, mid_request: bool) -> None:
        """The connection is gone; `mid_request`: a response was still owed on it."""
        self._lost = True
        callback, self._callback = self._callback, None
        if callback is not None and mid_request:
            callback()
