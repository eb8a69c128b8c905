"""A small, fast OpenAI-shaped upstream that paces its stream: each streamed chat completion sends
`tokens` chunks, token i at (i+1) x `delay_ms` after the request (absolute deadlines, so the ideal
stream time is exactly tokens x delay), then the usage chunk and `data: [DONE]`, as HTTP/1.1 chunked
like vLLM behind uvicorn. nginx can't pace, so this stands in for an engine at a realistic token rate.

    python paced_upstream.py --port 18082 --tokens 100 --delay-ms 20

GET */health -> 200 {}; POST */chat/completions -> the stream (or a JSON body when "stream" is not
true); anything else -> 404 (the gateway's /metrics scrape gets that). Raw asyncio protocol on uvloop,
no framework, so its own cost stays far below the gateway's."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contextlib

import bodies

_OK_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_MAX_HEAD = 64 * 1024


def _simple(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + ctype
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Upstream(asyncio.Protocol):
    def __init__(self, events: list[bytes], delay_s: float) -> None:
        self._events = [_chunk(e) for e in events]
        self._last = b"0\r\n\r\n"
        self._delay = delay_s
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self._busy: asyncio.Task[None] | None = None
        self._pending: list[tuple[bytes, bytes, bytes]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._busy is not None:
            self._busy.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD and self._transport is not None:
                    self._transport.close()
                return
            head = self._buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if len(self._buf) < end + 4 + length:
                return
            body = self._buf[end + 4 : end + 4 + length]
            self._buf = self._buf[end + 4 + length :]
            method, path = head.split(b" ", 2)[:2]
            self._pending.append((method, path, body))
            self._next()

    def _next(self) -> None:
        # One response at a time per connection (HTTP/1.1 pipelining order).
        if self._busy is not None or not self._pending or self._transport is None:
            return
        method, path, body = self._pending.pop(0)
        t = self._transport
        if path.endswith(b"/health"):
            t.write(_simple(b"200 OK", b"application/json", b"{}"))
        elif method == b"POST" and path.endswith(b"/chat/completions"):
            compact = body.replace(b" ", b"")
            if b'"stream":true' in compact:
                self._busy = asyncio.get_running_loop().create_task(self._stream(t))
                return
            t.write(_simple(b"200 OK", b"application/json", bodies.completion()))
        else:
            t.write(_simple(b"404 Not Found", b"application/json", b'{"error":"not found"}'))
        self._next()

    async def _stream(self, t: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            t.write(_OK_HEAD)
            start = loop.time()
            events = self._events
            content = len(events) - 2  # the usage chunk and [DONE] follow the last token at once
            for i, event in enumerate(events):
                if i < content and self._delay > 0:
                    wait = start + (i + 1) * self._delay - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                t.write(event)
            t.write(self._last)
        except asyncio.CancelledError:
            return
        finally:
            self._busy = None
        self._next()


async def main(host: str, port: int, tokens: int, delay_ms: float) -> None:
    loop = asyncio.get_running_loop()
    events = bodies.stream_events(tokens)
    server = await loop.create_server(lambda: Upstream(events, delay_ms / 1000), host, port, backlog=4096)
    print(f"paced upstream on http://{host}:{port}: {tokens} tokens, {delay_ms} ms apart", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18082)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--delay-ms", type=float, default=20.0)
    a = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(a.host, a.port, a.tokens, a.delay_ms))
