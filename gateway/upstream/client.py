"""The upstream HTTP client: kept-alive HTTP/1.1 connections (`pool.py`,
`connection.py`), per-phase timeouts, and the one place where connection failures become the
gateway's own errors (as httpx maps httpcore's).

Its own client on asyncio and httptools, not aiohttp's nor httpx's: on this project's benchmark a
Starlette + httpx proxy cost 2.8 ms CPU per request against 0.23 ms for aiohttp's client, and
aiohttp's client was still the largest single part of the gateway's CPU per request (20-27 %);
docs/benchmarks.md gives the measurement that replaced it."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from gateway.config import TimeoutsConfig
from gateway.deadlines import Deadlines
from gateway.errors import GatewayError, UpstreamError, UpstreamTimeout
from gateway.upstream.connection import BadResponse, ConnectionClosed, TimedOut, UpstreamConnection
from gateway.upstream.pool import ConnectionPool, Origin, split_url

_NOT_SENT = frozenset({"host", "content-length", "transfer-encoding", "connection"})
"""Headers the client writes itself (a caller's copy would be a second one)."""


class UpstreamConnectError(UpstreamError):
    """Nothing reached the backend, so another backend may safely be tried."""

    default_code = "upstream_connect_error"


class UpstreamDisconnected(UpstreamError):
    """The backend went away after the request was sent."""

    default_code = "upstream_disconnected"


class UpstreamTooLarge(UpstreamError):
    """A non-stream answer longer than limits.max_response_bytes: never buffered whole."""

    default_code = "response_too_large"


def error_kind(exc: GatewayError) -> str:
    """The `kind` label of gateway_upstream_errors_total for a translated error."""
    if isinstance(exc, UpstreamConnectError):
        return "connect"
    if isinstance(exc, UpstreamTooLarge):
        return "too_large"
    if isinstance(exc, UpstreamTimeout):
        return "timeout_ttfb"
    return "bad_response"


def translate(exc: BaseException, what: str) -> GatewayError:
    """Connection / OS errors -> GatewayError. Messages name the backend, never its URL."""
    if isinstance(exc, TimedOut | TimeoutError):
        return UpstreamTimeout(f"Backend {what} did not respond in time.")
    if isinstance(exc, ConnectionClosed | ConnectionError):
        return UpstreamDisconnected(f"Backend {what} closed the connection.")
    if isinstance(exc, BadResponse):
        return UpstreamError(f"Backend {what} sent a response that is not valid HTTP.")
    return UpstreamError(f"Backend {what} failed: {type(exc).__name__}.")


def connect_error(exc: BaseException, what: str) -> GatewayError:
    """A failure to open a connection: nothing was sent."""
    if isinstance(exc, TimeoutError | OSError | socket.gaierror | ssl.SSLError | UnicodeError):
        return UpstreamConnectError(f"Could not connect to backend {what}.")
    return UpstreamError(f"Backend {what} failed: {type(exc).__name__}.")


class UpstreamResponse:
    """An upstream answer whose reads raise only GatewayErrors (httpx's map_httpcore_exceptions
    pattern). Read whole, its connection goes back to the pool on release(); close() abandons it."""

    __slots__ = ("_conn", "_origin", "_pool", "_what", "headers", "status")

    def __init__(self, conn: UpstreamConnection, pool: ConnectionPool, origin: Origin, what: str) -> None:
        self._conn = conn
        self._pool = pool
        self._origin = origin
        self._what = what
        self.status = conn.status
        self.headers: Mapping[str, str] = conn.headers
        """Lower-case names; repeated fields joined with ", "."""

    async def read(self, limit: float, max_bytes: int) -> bytes:
        """The whole body, within `limit` seconds and `max_bytes` (docs/reliability.md defect 14:
        a 200 MB answer was buffered whole); past either the connection is closed."""
        conn = self._conn
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            conn.close()
            raise UpstreamTooLarge(f"Backend {self._what} sent a response larger than {max_bytes} bytes.")
        if conn.complete:  # most non-stream answers arrive whole: no wait, so no timer
            data = conn.take()
            if len(data) > max_bytes:
                conn.close()
                raise UpstreamTooLarge(f"Backend {self._what} sent a response larger than {max_bytes} bytes.")
            return data
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(limit):
                while chunk := await conn.read_chunk():
                    size += len(chunk)
                    if size > max_bytes:
                        conn.close()
                        raise UpstreamTooLarge(f"Backend {self._what} sent a response larger than {max_bytes} bytes.")
                    parts.append(chunk)
        except (ConnectionClosed, BadResponse, TimedOut, OSError, TimeoutError) as exc:
            conn.close()
            raise translate(exc, self._what) from None
        except BaseException:
            conn.close()  # cancelled (the client left, the idle or drain limit): the engine must stop
            raise
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def unread(self) -> bool:
        """Whether the backend has sent bytes the gateway has not read yet: a stream that went idle
        with some waiting was held up by its client (not reading), not by the backend."""
        return self._conn.buffered > 0

    async def read_error(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of an error body (empty when even that fails); the connection is closed."""
        conn = self._conn
        parts: list[bytes] = []
        try:
            await _read_upto(conn, max_bytes, parts)
        except (ConnectionClosed, BadResponse, TimedOut, OSError):
            pass
        finally:
            conn.close()
        return b"".join(parts)[:max_bytes]

    async def readany(self) -> bytes:
        """The next chunk of a stream; b"" at its end."""
        try:
            return await self._conn.read_chunk()
        except (ConnectionClosed, BadResponse, TimedOut, OSError) as exc:
            raise translate(exc, self._what) from None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop its connection runs on."""
        return self._conn.loop

    def splice(self, sink: Callable[[bytes], bool]) -> bool:
        """Hand the stream's later chunks to `sink` as they arrive (connection.py); False
        when chunks are waiting to be read first, or the stream is over."""
        return self._conn.splice(sink)

    async def wait_spliced(self) -> None:
        """Until the sink steps back, or the stream ends or fails: readany() then gives the rest."""
        await self._conn.wait_spliced()

    def release(self) -> None:
        """Done with a complete answer: the connection goes back to the pool."""
        self._pool.release(self._origin, self._conn)

    def close(self) -> None:
        """Abandon it: closing (not releasing) the connection makes the engine stop work."""
        self._conn.close()


class UpstreamClient:
    """Owns the connection pool for the app's lifetime (closed in lifespan)."""

    def __init__(self, timeouts: TimeoutsConfig) -> None:
        self._timeouts = timeouts
        self._pool = ConnectionPool()
        self._urls: dict[str, tuple[Origin, str, str]] = {}
        self._heads = Deadlines()
        """The first-byte limit of each request waiting for its answer's head."""
        self.closed = False

    async def start(self) -> None:
        """Nothing to open ahead: connections are made on first use."""

    async def close(self) -> None:
        self._heads.close()
        self._pool.close()
        self.closed = True

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], what: str, first_byte_s: float | None = None
    ) -> UpstreamResponse:
        """Send and wait for the response headers, at most first_byte_s."""
        limit = self._timeouts.first_byte_s if first_byte_s is None else first_byte_s
        return await self._send("POST", url, body, headers, what, limit)

    async def get_json(self, url: str, headers: Mapping[str, str], timeout_s: float, what: str) -> tuple[int, Any]:
        status, raw = await self.get(url, headers, timeout_s, what)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, None

    async def get(
        self, url: str, headers: Mapping[str, str], timeout_s: float, what: str, max_bytes: int = 4 << 20
    ) -> tuple[int, bytes]:
        return await self._exchange("GET", url, None, headers, timeout_s, what, max_bytes)

    async def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str], timeout_s: float, what: str
    ) -> tuple[int, Any]:
        body = json.dumps(payload).encode()
        status, raw = await self._exchange(
            "POST", url, body, {**headers, "content-type": "application/json"}, timeout_s, what, 4 << 20
        )
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, None

    async def _exchange(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout_s: float,
        what: str,
        max_bytes: int,
    ) -> tuple[int, bytes]:
        """A whole small exchange (health, discovery, metrics, admin calls) within timeout_s; an
        answer longer than max_bytes is cut there (the connection is then closed, not reused)."""
        resp: UpstreamResponse | None = None
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._send(method, url, body, headers, what, timeout_s)
                parts: list[bytes] = []
                await _read_upto(resp._conn, max_bytes, parts)
        except BaseException as exc:
            if resp is not None:
                resp.close()  # timed out, failed or cancelled in the body: never back to the pool
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeout(f"Backend {what} did not respond in time.") from None
            if isinstance(exc, ConnectionClosed | BadResponse | TimedOut | OSError):
                raise translate(exc, what) from None
            raise
        resp.release()
        return resp.status, b"".join(parts)[:max_bytes]

    async def _send(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], what: str, limit: float
    ) -> UpstreamResponse:
        """Write the request on a pooled connection and wait, at most `limit`, for the answer's head.
        A reused connection that the backend had closed just before (its keep-alive ran out as the
        request went) is retried once on a new one: nothing reached the engine."""
        parts = self._urls.get(url)
        if parts is None:
            try:
                parts = split_url(url)
            except ValueError as exc:
                raise UpstreamError(f"Backend {what} has an unusable URL: {exc}.") from None
            if len(self._urls) < 4096:
                self._urls[url] = parts
        origin, host, path = parts
        head = _head(method, path, host, headers, body, what)
        pool, heads = self._pool, self._heads
        for attempt in range(2):
            conn = pool.take(origin) if attempt == 0 else None  # the retry: a new connection
            reused = conn is not None
            if conn is None:
                try:
                    async with asyncio.timeout(self._timeouts.connect_s):
                        conn = await pool.connect(origin)
                except (OSError, TimeoutError, ssl.SSLError, UnicodeError) as exc:  # UnicodeError: IDNA
                    raise connect_error(exc, what) from None
            stale = False  # (a flag, not a `continue`: mypyc compiles no continue inside a finally's try)
            heads.add(conn, limit, conn.time_out, conn.loop)
            try:
                await conn.request(head, body or b"")
                await conn.wait_head()
            except (ConnectionClosed, BadResponse, OSError, TimedOut) as exc:
                conn.close()
                if not (reused and isinstance(exc, ConnectionClosed) and not conn.received):
                    raise translate(exc, what) from None
                stale = True
            except BaseException:
                conn.close()  # cancelled: the engine must not go on with it
                raise
            finally:
                heads.discard(conn)
            if not stale:
                return UpstreamResponse(conn, pool, origin, what)
        raise UpstreamDisconnected(f"Backend {what} closed the connection.")


async def _read_upto(conn: UpstreamConnection, max_bytes: int, parts: list[bytes]) -> None:
    """Append the answer's body to `parts` until its end or past `max_bytes` (the caller cuts)."""
    size = 0
    while size < max_bytes and (chunk := await conn.read_chunk()):
        parts.append(chunk)
        size += len(chunk)


def _head(method: str, path: str, host: str, headers: Mapping[str, str], body: bytes | None, what: str) -> bytes:
    """The request's head: the caller's headers (less those the client writes) and the length.
    A CR or LF inside a name or value (or the path) would end a line early: the head is refused if
    its CR and LF counts are not exactly one pair a line, checked once on the whole head rather than
    five times a header (each `in` is a call on this path, per attempt)."""
    lines = [f"{method} {path} HTTP/1.1\r\nhost: {host}\r\n"]
    for name, value in headers.items():
        if name.lower() in _NOT_SENT:
            continue
        if ":" in name:
            raise UpstreamError(f"A header for backend {what} is not a valid header line; it was not sent.")
        lines.append(f"{name}: {value}\r\n")
    if body is not None:
        lines.append(f"content-length: {len(body)}\r\n")
    lines.append("\r\n")
    text = "".join(lines)
    ends = len(lines) + 1  # the first entry holds two lines
    if text.count("\n") != ends or text.count("\r") != ends:
        raise UpstreamError(f"A header for backend {what} is not a valid header line; it was not sent.")
    return text.encode("utf-8")
