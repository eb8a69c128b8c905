"""The HTTP protocol under uvicorn: its httptools protocol plus a deadline for receiving a whole
request (headers and body), so that a slowloris client (a header byte every few seconds) cannot
hold a connection for ever. uvicorn itself has no such deadline."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def protocol_class(request_timeout_s: float) -> type[HttpToolsProtocol]:
    """A protocol class with this deadline, for uvicorn.Config(http=...)."""

    class DeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()  # the next request on a kept-alive connection

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is None and request_timeout_s > 0:
                self._deadline = self.loop.call_later(request_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return DeadlineProtocol
