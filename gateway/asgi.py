"""The ASGI types, declared once for the whole gateway (they are starlette's own), and the one scope
key the gateway's server adds."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ARRIVED", "CLIENT_GONE", "ASGIApp", "ClientGone", "Message", "Receive", "Scope", "Send"]

ARRIVED = "gateway.arrived"
"""`time.perf_counter()` when the request's first byte was parsed (serving/protocol.py sets it; the
endpoint starts the request's clock there)."""

CLIENT_GONE = "gateway.client_gone"
"""A `ClientGone` hook (serving/protocol.py sets it): the endpoint hands it a callback for the moment
the client's connection is lost before its response is complete, instead of a task that waits on
`receive()` for `http.disconnect` (which it still runs under another server)."""


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
