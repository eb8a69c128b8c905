"""Kept-alive connections to the backends, by origin (scheme, host, port): a request takes the most
recently used idle connection (or opens one, within the connect timeout) and gives it back when its
answer was read whole; an abandoned answer closes its connection, which is what makes an engine stop
generating. Idle connections the backend closes leave the pool at once; those idle longer than
IDLE_S are closed by one sweep timer for the whole pool (armed only while some are idle), so a burst
of a thousand streams leaves no thousand idle sockets behind."""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import cast
from urllib.parse import urlsplit

from gateway.upstream.connection import UpstreamConnection

IDLE_S = 15.0
"""How long an idle connection is kept (aiohttp's default keep-alive, and longer than no engine's)."""

Origin = tuple[str, str, int]


def split_url(url: str) -> tuple[Origin, str, str]:
    """(origin, Host header, path with query) of an http(s) URL; ValueError for anything else."""
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {scheme or 'no scheme'}")
    default = 443 if scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    host_header = f"[{host}]" if ":" in host else host
    if port != default:
        host_header = f"{host_header}:{port}"
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return (scheme, host, port), host_header, path


class ConnectionPool:
    """Idle connections per origin; no limit on how many are open (as aiohttp's limit=0 was)."""

    def __init__(self) -> None:
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._tls: ssl.SSLContext | None = None
        self._open: set[UpstreamConnection] = set()
        """Every connection not yet lost (each leaves it in `connection_lost`): a plain set, not a
        WeakSet, because a compiled connection class does not clear weak references to it when freed."""
        self._sweeper: asyncio.TimerHandle | None = None

    def take(self, origin: Origin) -> UpstreamConnection | None:
        """The most recently used idle connection to origin that is still open, if any."""
        idle = self._idle.get(origin)
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                conn.on_lost = None
                # Bytes that came while it sat idle (a stray answer, a 408 before a close) would
                # be read as the next answer's: such a connection is closed, not reused.
                if not conn.closed and not conn.received and now - conn.idle_since < IDLE_S:
                    conn.reset()
                    return conn
                conn.close()
        return None

    def release(self, origin: Origin, conn: UpstreamConnection) -> None:
        """Back to the pool if its answer was read whole; closed otherwise."""
        if not conn.reusable:
            conn.close()
            return
        idle = self._idle.get(origin)
        if idle is None:
            idle = self._idle[origin] = []
        conn.idle_since = time.monotonic()
        conn.received = False
        conn.on_lost = idle
        idle.append(conn)
        if self._sweeper is None:
            self._sweeper = conn.loop.call_later(IDLE_S / 3, self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle past IDLE_S (the oldest are first in each list)."""
        self._sweeper = None
        cutoff = time.monotonic() - IDLE_S
        waiting = False
        for idle in self._idle.values():
            while idle and idle[0].idle_since <= cutoff:
                conn = idle.pop(0)
                conn.on_lost = None
                conn.close()
            waiting = waiting or bool(idle)
        if waiting:
            self._sweeper = asyncio.get_running_loop().call_later(IDLE_S / 3, self._sweep)

    def close(self) -> None:
        """Close every connection (the app's shutdown)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

    async def connect(self, origin: Origin) -> UpstreamConnection:
        """A new connection to origin (the caller bounds the wait)."""
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        _, proto = await loop.create_connection(
            lambda: cast(asyncio.Protocol, UpstreamConnection(loop)),  # a Protocol in all but name
            host,
            port,
            ssl=tls,
            server_hostname=host if tls else None,
        )
        conn = cast(UpstreamConnection, proto)
        if not conn.closed:  # lost already (connection_lost ran first): nothing to track
            self._open.add(conn)
            conn.opened = self._open
        return conn
