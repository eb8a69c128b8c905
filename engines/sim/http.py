"""A deliberately small HTTP/1.1 connection over asyncio streams, for the simulator.

Keep-alive, Content-Length request bodies, chunked responses, writes split into N-byte pieces, FIN or RST
on purpose, and detection of the client going away (EOF or reset) at any moment while a response is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
# While a response is being made the connection keeps reading (to see EOF); this bounds what a client
# that pipelines or floods us can make us buffer.
_MAX_BUFFERED = 1024 * 1024


class ClientGone(Exception):
    """The client closed or reset the connection."""


class BadRequest(Exception):
    """The request could not be parsed; answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class HttpRequest:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        return "keep-alive" in tokens if self.version == "HTTP/1.0" else "close" not in tokens


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {reason_phrase(status)}\r\n".encode()


class HttpConn:
    """One client connection. ``gone`` is set as soon as the client is seen to have left."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._buf = bytearray()
        self._eof = False
        self._watcher: asyncio.Task[None] | None = None
        self._wakers: list[asyncio.Event] = []
        self.gone = asyncio.Event()
        self.gone_at: float | None = None  # time.monotonic() when the client was seen to leave
        self.split = 0  # write in pieces of this many bytes (0: whole writes)
        self.writes = 0  # write calls made, so tests can see that split took effect
        self.close_after = False  # the current request asked for Connection: close

    # -- reading --------------------------------------------------------------------------------------
    async def _fill(self) -> bool:
        try:
            data = await self._reader.read(65536)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            self._eof = True
            return False
        self._buf += data
        return True

    async def read_request(self) -> HttpRequest | None:
        """The next request, or None when the client closed the connection first."""
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise BadRequest(431, "request head too large")
            if self._eof or not await self._fill():
                return None
        head = bytes(self._buf[:end]).decode("latin-1").lstrip("\r\n").split("\r\n")
        del self._buf[: end + 4]
        parts = head[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(400, "malformed request line")
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or " " in name:
                raise BadRequest(400, "malformed header line")
            key = name.lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        if "transfer-encoding" in headers:
            raise BadRequest(501, "chunked request bodies are not supported by the simulator")
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            raise BadRequest(400, "bad Content-Length")  # also catches "10, 12" from repeated headers
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            raise BadRequest(413, "request body too large")
        if headers.get("expect", "").lower() == "100-continue":
            await self.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(self._buf) < length:
            if self._eof or not await self._fill():
                return None
        body = bytes(self._buf[:length])
        del self._buf[:length]
        return HttpRequest(parts[0], parts[1], parts[2], headers, body)

    # -- watching for the client to leave -----------------------------------------------------------
    def watch(self) -> None:
        """Start noticing EOF/reset while a response is being made (call after ``read_request``)."""
        self.writes = 0
        if self._eof:
            self._mark_gone()
        elif self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def unwatch(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        self._wakers.clear()

    async def _watch(self) -> None:
        # Reading is the only way to see a FIN; bytes read here (a pipelined request) stay in the buffer.
        while len(self._buf) < _MAX_BUFFERED:
            if not await self._fill():
                self._mark_gone()
                return

    def _mark_gone(self) -> None:
        if self.gone_at is None:
            self.gone_at = time.monotonic()
        self.gone.set()
        for event in self._wakers:
            event.set()

    def wake_on_gone(self, event: asyncio.Event) -> None:
        """Also set ``event`` when the client leaves, so one wait covers both."""
        self._wakers.append(event)
        if self.gone.is_set():
            event.set()

    async def sleep(self, seconds: float) -> None:
        """Sleep, but raise ClientGone as soon as the client leaves."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.gone.wait(), seconds)
        if self.gone.is_set():
            raise ClientGone

    # -- writing --------------------------------------------------------------------------------------
    async def send(self, data: bytes) -> None:
        if self.gone.is_set() or self._writer.is_closing():
            # A reset closes the transport before the watcher's read sees it: that is the client
            # leaving all the same, so record when.
            self._mark_gone()
            raise ClientGone
        step = self.split or len(data) or 1
        try:
            for start in range(0, len(data), step):
                self._writer.write(data[start : start + step])
                self.writes += 1
                await self._writer.drain()
                if self.split:
                    await asyncio.sleep(0)  # give the peer a chance to read each piece on its own
        except (ConnectionError, OSError) as exc:
            self._mark_gone()
            raise ClientGone from exc

    async def send_head(self, status: int, headers: list[tuple[str, str]]) -> None:
        lines = [f"{k}: {v}\r\n" for k, v in headers]
        await self.send(status_line(status) + "".join(lines).encode("latin-1") + b"\r\n")

    async def send_chunk(self, data: bytes) -> None:
        """One chunk of a chunked body; ``b""`` ends the body."""
        await self.send(b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n")

    async def kill(self, rst: bool) -> None:
        """Close on purpose: FIN after what was written, or RST (SO_LINGER 0) once it has left our buffer."""
        if not rst:
            self._writer.close()
            return
        # Unsent bytes would be discarded by the reset; wait (bounded) until asyncio has handed them over.
        for _ in range(1000):
            if self._writer.transport.get_write_buffer_size() == 0:
                break
            await asyncio.sleep(0.001)
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._writer.transport.abort()

    async def close(self) -> None:
        await self.unwatch()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
