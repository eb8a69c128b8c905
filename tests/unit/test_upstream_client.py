"""The upstream HTTP client (gateway/upstream/: client.py on connection.py and pool.py)
against a real local TCP "backend" written with asyncio.start_server, which sends raw bytes, so each
test decides exactly what goes over the wire: framing (content-length, chunked, until close),
keep-alive reuse, a stale pooled connection, back-pressure, timeouts, bad bytes, and how each
failure becomes a gateway error. Each test runs under a 5 s asyncio.timeout (in `serve`), and the
most timing-sensitive ones are run again on uvloop, which the gateway runs on in production."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from gateway.config import TimeoutsConfig
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.upstream.client import UpstreamClient, UpstreamConnectError, UpstreamDisconnected, UpstreamTooLarge, _head
from gateway.upstream.connection import HIGH_WATER, UpstreamConnection
from tests.unit.raw_server import RawServer, serving

pytestmark = pytest.mark.unit

MiB = 1024 * 1024
BODY = b'{"prompt": "hi"}'
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def ok(body: bytes = b"hello", extra: bytes = b"", status: bytes = b"200 OK") -> bytes:
    """A whole content-length answer."""
    return b"HTTP/1.1 %s\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Peer:
    """One connection the backend accepted."""

    def __init__(self, backend: Backend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int):
        self.backend = backend
        self.reader = reader
        self.writer = writer
        self.index = index
        """0 for the backend's first connection, 1 for its second..."""

    async def request(self) -> bytes:
        """One whole request, head and body (asyncio.IncompleteReadError at EOF ends the handler)."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await self.reader.readexactly(length) if length else b""
        self.backend.requests.append((self.index, head + body))
        return head + body

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def wait_eof(self) -> None:
        """Until the client closes (FIN or reset); then backend.eof is set."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.backend.eof_at = time.monotonic()
        self.backend.eof.set()


Handler = Callable[[Peer], Awaitable[None]]


class Backend(RawServer):
    """A raw-bytes HTTP backend on 127.0.0.1: `handler` runs once per accepted connection."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.requests: list[tuple[int, bytes]] = []
        """(connection index, request bytes) in the order they were read."""
        self.eof = asyncio.Event()
        self.eof_at = 0.0
        self.url = ""

    async def start(self) -> None:
        await self.listen()
        self.url = f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await self.handler(Peer(self, reader, writer, index))


def serve(handler: Handler) -> contextlib.AbstractAsyncContextManager[tuple[Backend, UpstreamClient]]:
    """A started backend and a client, both closed after; the whole test within 5 s."""
    return serving(Backend(handler), first_byte_s=5.0)


async def answer(client: UpstreamClient, backend: Backend) -> bytes:
    """One whole request and answer, the connection back to the pool."""
    resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
    body = await resp.read(2.0, 1000)
    resp.release()
    return body


async def keep_alive(peer: Peer) -> None:
    """Answers every request on the connection with ok()."""
    while True:
        await peer.request()
        await peer.send(ok())


async def ten_of_a_hundred(peer: Peer) -> None:
    """Sends the head and 10 of the 100 body bytes it announced, then waits for the client's close."""
    await peer.request()
    await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
    await peer.wait_eof()


def chunked_stream(parts: list[bytes], gap_s: float) -> Handler:
    """Answers every request on the connection with `parts` as chunks, `gap_s` apart, then the end."""

    async def stream(peer: Peer) -> None:
        while True:
            await peer.request()
            await peer.send(CHUNKED_HEAD)
            for part in parts:
                await asyncio.sleep(gap_s)
                await peer.send(chunk(part))
            await asyncio.sleep(gap_s)
            await peer.send(LAST_CHUNK)

    return stream


def headers_of(request: bytes) -> list[tuple[str, str]]:
    head = request.split(b"\r\n\r\n", 1)[0].decode()
    return [(n.strip().lower(), v.strip()) for n, _, v in (line.partition(":") for line in head.split("\r\n")[1:])]


# -- framing and reuse ------------------------------------------------------------------------------


async def test_a_content_length_answer_is_read_whole_and_its_connection_reused() -> None:
    async with serve(keep_alive) as (backend, client):
        for _ in range(2):
            resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
            assert resp.status == 200 and resp.headers["content-length"] == "5"
            assert await resp.read(2.0, 1000) == b"hello"
            resp.release()
        assert backend.connections == 1
        assert [index for index, _ in backend.requests] == [0, 0]
        assert all(request.endswith(b"\r\n\r\n" + BODY) for _, request in backend.requests)


async def test_a_chunked_answer_is_streamed_chunk_by_chunk_and_its_connection_reused() -> None:
    parts = [b"data: one\n\n", b"data: two\n\n", b"data: three\n\n"]
    async with serve(chunked_stream(parts, 0.02)) as (backend, client):
        for _ in range(2):
            resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
            received: list[bytes] = []
            while data := await resp.readany():
                received.append(data)
            assert b"".join(received) == b"".join(parts)
            assert len(received) >= 2  # read as it came, not buffered to the end
            resp.release()
        assert backend.connections == 1 and len(backend.requests) == 2


async def test_a_spliced_stream_goes_to_its_sink_in_order_until_the_sink_steps_back() -> None:
    """splice(): each chunk goes to the sink as it is parsed, none is buffered and the reader is not
    woken for it; a sink that returns False has taken that chunk and is detached, and the chunks
    after it are buffered for readany() again, in order. The connection is reusable at the end."""
    parts = [b"data: %d\n\n" % i for i in range(6)]
    async with serve(chunked_stream(parts, 0.01)) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        taken: list[bytes] = []

        def sink(data: bytes) -> bool:
            taken.append(data)
            return len(taken) < 3  # steps back with the third

        assert resp.splice(sink)
        await resp.wait_spliced()
        assert taken == parts[:3] and not resp.unread()
        rest: list[bytes] = []
        while data := await resp.readany():
            rest.append(data)
        assert b"".join(rest) == b"".join(parts[3:])
        assert not resp.splice(sink)  # the answer is over: nothing to attach to
        resp.release()
        assert await answer_of_stream(client, backend) == b"".join(parts)  # the same connection again
        assert backend.connections == 1


async def answer_of_stream(client: UpstreamClient, backend: Backend) -> bytes:
    resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
    received: list[bytes] = []

    def sink(data: bytes) -> bool:
        received.append(data)
        return True

    assert resp.splice(sink)
    await resp.wait_spliced()  # returns at the answer's end: the sink never stepped back
    assert await resp.readany() == b""
    resp.release()
    return b"".join(received)


async def test_splice_is_refused_while_chunks_wait_and_a_cancelled_wait_detaches_the_sink() -> None:
    async def stream(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunk(b"data: early\n\n"))
        await asyncio.sleep(0.3)
        await peer.send(chunk(b"data: late\n\n"))
        await peer.wait_eof()

    async with serve(stream) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        while not resp.unread():
            await asyncio.sleep(0.005)
        taken: list[bytes] = []

        def sink(data: bytes) -> bool:
            taken.append(data)
            return True

        assert not resp.splice(sink)  # "early" waits: read it first
        assert await resp.readany() == b"data: early\n\n"
        assert resp.splice(sink)
        waiting = asyncio.ensure_future(resp.wait_spliced())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await resp.readany() == b"data: late\n\n"  # buffered again: the sink is gone
        assert taken == []
        resp.close()


async def test_an_answer_ended_by_the_close_is_complete_and_its_connection_not_reused() -> None:
    async def until_close(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst part, ")
        await asyncio.sleep(0.05)
        await peer.send(b"second part")
        # returning closes the connection: that ends the body

    async with serve(until_close) as (backend, client):
        for _ in range(2):
            resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
            assert await resp.read(2.0, 1000) == b"first part, second part"
            resp.release()
        assert backend.connections == 2


async def test_an_answer_with_connection_close_is_not_reused() -> None:
    async def close_after(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(extra=b"connection: close\r\n"))
        await peer.wait_eof()  # the client must be the one that closes, having read the header

    async with serve(close_after) as (backend, client):
        for _ in range(2):
            assert await answer(client, backend) == b"hello"
        assert backend.connections == 2


async def test_a_cancelled_body_read_closes_its_connection() -> None:
    """The client left (or a limit passed) while a non-stream answer was still coming: the backend
    must see its connection closed, so that the engine stops."""

    async with serve(ten_of_a_hundred) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        task = asyncio.create_task(resp.read(5.0, 1000))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(1):
            await backend.eof.wait()


async def test_the_first_byte_limit_ends_a_request_whose_body_the_backend_never_reads() -> None:
    """A write that waits for a backend which does not read: the limit still ends it (a graceful
    close would wait for the write buffer for ever)."""

    async def deaf(peer: Peer) -> None:
        await asyncio.sleep(10)  # accepts, never reads

    async with serve(deaf) as (backend, client):
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout):
            await client.post(f"{backend.url}/v1/x", b"x" * (64 * MiB), {}, "b1", first_byte_s=0.3)
        assert time.monotonic() - started < 2.0


async def test_a_head_that_arrives_as_the_limit_passes_wins() -> None:
    """The deadline's callback and the head in one loop turn: the answer is read, not failed with
    an error the callers do not map."""

    async def head_then_body(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
        await asyncio.sleep(0.05)
        await peer.send(b"hello")
        await peer.wait_eof()

    async with serve(head_then_body) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        resp._conn.time_out()  # as if the deadline fired right after the head came
        assert await resp.read(2.0, 1000) == b"hello"


async def test_bytes_that_came_while_a_connection_was_idle_are_never_read_as_the_next_answer() -> None:
    async def stray(peer: Peer) -> None:
        if peer.index > 0:
            await keep_alive(peer)
            return
        await peer.request()
        await peer.send(ok(b"first"))
        await asyncio.sleep(0.05)
        await peer.send(ok(b"stale"))  # an answer nobody asked for, on the idle connection
        await keep_alive(peer)

    async with serve(stray) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert await resp.read(2.0, 1000) == b"first"
        resp.release()
        await asyncio.sleep(0.15)
        assert await answer(client, backend) == b"hello"
        assert backend.connections == 2  # the tainted one was closed, not reused


async def test_the_retry_of_a_stale_connection_goes_on_a_new_one_even_with_more_idle() -> None:
    """Two pooled connections both closed by the backend as the requests went: the retry does not
    take the second stale one from the pool."""

    async def stale(peer: Peer) -> None:
        if peer.index < 2:
            await peer.request()
            await peer.send(ok())
            await peer.request()
            return  # closes without answering the second request
        await keep_alive(peer)

    async with serve(stale) as (backend, client):
        first = await asyncio.gather(*(client.post(f"{backend.url}/v1/x", BODY, {}, "b1") for _ in range(2)))
        for resp in first:
            assert await resp.read(2.0, 1000) == b"hello"
            resp.release()
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert await resp.read(2.0, 1000) == b"hello"
        assert backend.connections == 3


def _live_connections() -> int:
    """Connections still allocated, freed or not by the collector (it tracks them either way; a
    weak reference would not do: the compiled class does not support them)."""
    return sum(type(o) is UpstreamConnection for o in gc.get_objects())


async def test_a_closed_connection_is_freed_without_the_cycle_collector() -> None:
    """The gateway runs full collections minutes apart (serving/server.py tune_gc): a closed
    connection left in a reference cycle (it and its parser) held ~4 KiB a stream until then."""

    async def close_after(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(extra=b"connection: close\r\n"))
        await peer.wait_eof()

    gc.collect()  # what earlier tests left
    gc.disable()
    try:
        async with serve(close_after) as (backend, client):
            resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
            assert await resp.read(2.0, 1000) == b"hello"
            assert _live_connections() == 1
            resp.release()  # not reusable: closed
            del resp
            for _ in range(20):
                await asyncio.sleep(0.01)
                if _live_connections() == 0:
                    break
            assert _live_connections() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("how", ["readany", "read"])
async def test_a_close_in_the_middle_of_the_body_is_a_disconnect(how: str) -> None:
    async def short(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
        await asyncio.sleep(0.05)

    async with serve(short) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        with pytest.raises(UpstreamDisconnected):
            if how == "read":
                await resp.read(2.0, 1000)
            else:
                received = b""
                while data := await resp.readany():
                    received += data
                pytest.fail(f"the truncated body ended normally: {received!r}")


async def test_a_chunked_answer_cut_by_the_close_is_a_disconnect() -> None:
    async def cut(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await asyncio.sleep(0.05)

    async with serve(cut) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert await resp.readany() == b"data: one\n\n"
        with pytest.raises(UpstreamDisconnected):
            await resp.readany()


async def test_a_capitalised_chunked_answer_cut_by_the_close_is_a_disconnect() -> None:
    async def cut(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n" + chunk(b"data: one\n\n"))
        await asyncio.sleep(0.05)

    async with serve(cut) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert await resp.readany() == b"data: one\n\n"
        with pytest.raises(UpstreamDisconnected):
            await resp.readany()


@pytest.mark.parametrize("together", [False, True], ids=["apart", "in-one-write"])
async def test_an_interim_1xx_answer_is_skipped(together: bool) -> None:
    async def early_hints(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\n")
        if not together:
            await asyncio.sleep(0.05)
        await peer.send(ok())
        await peer.wait_eof()

    async with serve(early_hints) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert resp.status == 200
        assert "link" not in resp.headers
        assert await resp.read(2.0, 1000) == b"hello"


# -- timeouts and connection failures ---------------------------------------------------------------


async def test_no_head_within_first_byte_s_is_a_timeout_and_closes_the_connection() -> None:
    async def silent(peer: Peer) -> None:
        await peer.request()
        await peer.wait_eof()

    async with serve(silent) as (backend, client):
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout):
            await client.post(f"{backend.url}/v1/x", BODY, {}, "b1", first_byte_s=0.2)
        assert 0.15 <= time.monotonic() - started < 1.0
        await asyncio.wait_for(backend.eof.wait(), 1.0)


async def test_a_body_slower_than_the_read_limit_is_a_timeout_and_closes_the_connection() -> None:
    async with serve(ten_of_a_hundred) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout):
            await resp.read(0.2, 1000)
        assert time.monotonic() - started < 1.0
        await asyncio.wait_for(backend.eof.wait(), 1.0)


async def test_a_small_exchange_timing_out_in_the_body_closes_the_connection() -> None:
    async def stalls(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await peer.wait_eof()

    async with serve(stalls) as (backend, client):
        with pytest.raises(UpstreamTimeout):
            await client.get_json(f"{backend.url}/health", {}, 0.2, "b1")
        await asyncio.wait_for(backend.eof.wait(), 1.0)


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    client = UpstreamClient(TimeoutsConfig(connect_s=2.0, first_byte_s=5.0))
    try:
        async with asyncio.timeout(5):
            with pytest.raises(UpstreamConnectError):
                await client.post(f"http://127.0.0.1:{port}/v1/x", BODY, {}, "b1")
            with pytest.raises(UpstreamConnectError):
                await client.get_json(f"http://127.0.0.1:{port}/health", {}, 2.0, "b1")
    finally:
        await client.close()


async def test_a_pooled_connection_the_backend_closed_while_idle_is_not_used() -> None:
    async def once(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok())
        if peer.index == 0:
            return  # keep-alive was announced, but the idle connection is closed now
        await keep_alive(peer)

    async with serve(once) as (backend, client):
        assert await answer(client, backend) == b"hello"
        await asyncio.sleep(0.1)
        assert not any(client._pool._idle.values())  # it left the pool when the backend closed it
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert resp.status == 200 and await resp.read(2.0, 1000) == b"hello"
        resp.release()
        assert backend.connections == 2
        assert [index for index, _ in backend.requests] == [0, 1]


async def test_connections_idle_past_idle_s_are_closed_by_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """No request needs to come for the idle ones to be closed: a burst leaves no sockets behind."""
    monkeypatch.setattr("gateway.upstream.pool.IDLE_S", 0.3)

    async def answer_then_wait(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok())
        await peer.wait_eof()

    async with serve(answer_then_wait) as (backend, client):
        answers = await asyncio.gather(*(client.post(f"{backend.url}/v1/x", BODY, {}, "b1") for _ in range(3)))
        for resp in answers:
            assert await resp.read(2.0, 1000) == b"hello"
            resp.release()
        assert backend.connections == 3 and sum(len(v) for v in client._pool._idle.values()) == 3
        await asyncio.sleep(0.6)
        assert not any(client._pool._idle.values())
        assert backend.eof.is_set()  # the backend saw them closed


async def test_a_pooled_connection_closed_as_the_request_went_is_retried_on_a_new_one() -> None:
    async def stale(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.send(ok())
            await peer.request()
            return  # the keep-alive ran out just as the second request came: no answer, closed
        await keep_alive(peer)

    async with serve(stale) as (backend, client):
        assert await answer(client, backend) == b"hello"
        resp = await client.post(f"{backend.url}/v1/x", b'{"second": 1}', {}, "b1")
        assert resp.status == 200 and await resp.read(2.0, 1000) == b"hello"
        resp.release()
        assert backend.connections == 2
        assert [index for index, _ in backend.requests] == [0, 0, 1]
        assert backend.requests[1][1] == backend.requests[2][1]  # the same request, sent again


async def test_a_retry_is_made_once_and_never_for_a_fresh_connection() -> None:
    async def stale(peer: Peer) -> None:
        await peer.request()
        if peer.index == 0:
            await peer.send(ok())
            await peer.request()
        # every other request: the connection is closed without an answer

    async with serve(stale) as (backend, client):
        assert await answer(client, backend) == b"hello"
        with pytest.raises(UpstreamDisconnected):
            await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert backend.connections == 2  # the pooled one, then one retry on a new one
        with pytest.raises(UpstreamDisconnected):
            await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert backend.connections == 3  # a new connection closed on its first request: no retry


# -- bad bytes and bad headers ----------------------------------------------------------------------


async def test_garbage_instead_of_a_response_is_an_upstream_error() -> None:
    async def garbage(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HELLO\r\n\r\n")
        await peer.wait_eof()  # kept open: only the parser can tell the client it is not HTTP

    async with serve(garbage) as (backend, client):
        with pytest.raises(UpstreamError) as caught:
            await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert not isinstance(caught.value, UpstreamDisconnected)
        assert "not valid HTTP" in str(caught.value)
        await asyncio.wait_for(backend.eof.wait(), 1.0)


async def test_garbage_in_a_chunked_body_is_an_upstream_error() -> None:
    async def garbage(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await asyncio.sleep(0.05)
        await peer.send(b"zz-not-a-size\r\n")
        await peer.wait_eof()

    async with serve(garbage) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        with pytest.raises(UpstreamError) as caught:
            while await resp.readany():
                pass
        assert not isinstance(caught.value, UpstreamDisconnected)
        await asyncio.wait_for(backend.eof.wait(), 1.0)


@pytest.mark.parametrize(
    "headers",
    [
        {"x-trace": "abc\r\nx-injected: 1"},
        {"x-trace": "abc\nx-injected: 1"},
        {"x-trace": "abc\rx-injected: 1"},
        {"x-trace\r\nx-injected": "1"},
        {"x-a: b": "1"},
    ],
)
async def test_a_header_with_a_line_break_is_refused_and_nothing_is_sent(headers: dict[str, str]) -> None:
    async with serve(keep_alive) as (backend, client):
        with pytest.raises(UpstreamError) as caught:
            await client.post(f"{backend.url}/v1/x", BODY, headers, "b1")
        assert not isinstance(caught.value, UpstreamConnectError | UpstreamDisconnected)
        with pytest.raises(UpstreamError):
            await client.get_json(f"{backend.url}/health", headers, 2.0, "b1")
        await asyncio.sleep(0.05)
        assert backend.connections == 0 and backend.requests == []


# -- size limits and back-pressure ------------------------------------------------------------------


async def test_a_declared_length_over_max_bytes_is_too_large_without_reading_it() -> None:
    async def big(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n0123456789")
        await peer.wait_eof()  # the rest never comes: only the declaration can say it is too large

    async with serve(big) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        with pytest.raises(UpstreamTooLarge):
            await resp.read(2.0, 999)
        await asyncio.wait_for(backend.eof.wait(), 1.0)


@pytest.mark.parametrize("spaced", [True, False], ids=["as-it-comes", "already-whole"])
async def test_a_chunked_body_over_max_bytes_is_too_large(spaced: bool) -> None:
    async def chunks(peer: Peer) -> None:
        while True:
            await peer.request()
            await peer.send(CHUNKED_HEAD)
            for _ in range(3):
                if spaced:
                    await asyncio.sleep(0.02)
                await peer.send(chunk(b"0123456789"))
            await peer.send(LAST_CHUNK)

    async with serve(chunks) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert await resp.read(2.0, 30) == b"0123456789" * 3  # exactly max_bytes is allowed
        resp.release()
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        if not spaced:
            while not resp._conn.complete:
                await asyncio.sleep(0.01)
        with pytest.raises(UpstreamTooLarge):
            await resp.read(2.0, 29)
        assert resp._conn.closed
        resp.release()
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert await resp.read(2.0, 30) == b"0123456789" * 3
        resp.release()
        assert backend.connections == 2  # the too-large answer's connection was not reused


async def test_a_reader_that_does_not_read_holds_the_backend_up() -> None:
    payload = random.Random(7).randbytes(2 * MiB)

    async def flood(peer: Peer) -> None:
        await peer.request()
        await peer.send(CHUNKED_HEAD)
        for start in range(0, len(payload), 64 * 1024):
            await peer.send(chunk(payload[start : start + 64 * 1024]))
        await peer.send(LAST_CHUNK)
        await keep_alive(peer)

    async with serve(flood) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        await asyncio.sleep(0.3)
        buffered = resp._conn.buffered
        assert HIGH_WATER < buffered < HIGH_WATER + MiB, buffered
        assert resp.unread()
        assert await resp.read(5.0, 4 * MiB) == payload
        assert not resp.unread()
        resp.release()
        assert await answer(client, backend) == b"hello"
        assert backend.connections == 1


# -- abandoning an answer ---------------------------------------------------------------------------


async def test_closing_an_unfinished_stream_closes_its_connection_at_once() -> None:
    async def stream(peer: Peer) -> None:
        if peer.index > 0:
            await keep_alive(peer)
            return
        await peer.request()
        await peer.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await peer.wait_eof()

    async with serve(stream) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert await resp.readany() == b"data: one\n\n"
        closed_at = time.monotonic()
        resp.close()
        await asyncio.wait_for(backend.eof.wait(), 1.0)
        assert backend.eof_at - closed_at < 1.0
        resp.release()  # harmless after close: it must not go back to the pool
        assert await answer(client, backend) == b"hello"
        assert backend.connections == 2


async def test_read_error_reads_at_most_max_bytes_and_closes_the_connection() -> None:
    async def error(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b'{"error": "' + b"x" * 200 + b'"}', status=b"500 Internal Server Error"))
        await peer.wait_eof()

    async with serve(error) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert resp.status == 500
        assert await resp.read_error(20) == b'{"error": "' + b"x" * 9
        await asyncio.wait_for(backend.eof.wait(), 1.0)


# -- headers and the small exchanges ----------------------------------------------------------------


async def test_repeated_headers_are_joined_and_names_lower_cased() -> None:
    async def headers(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(extra=b"X-A: 1\r\nx-a: 2\r\nContent-Type: text/plain\r\nX-Request-ID: r-1\r\n"))

    async with serve(headers) as (backend, client):
        resp = await client.post(f"{backend.url}/v1/x", BODY, {}, "b1")
        assert resp.headers["x-a"] == "1, 2"
        assert resp.headers["content-type"] == "text/plain"
        assert resp.headers["x-request-id"] == "r-1"
        assert all(name == name.lower() for name in resp.headers)
        assert await resp.read(2.0, 1000) == b"hello"


async def test_get_json_returns_the_status_and_the_parsed_body() -> None:
    answers = [ok(b'{"ok": true, "n": [1, 2]}', b"content-type: application/json\r\n"), ok(b"not json")]

    async def health(peer: Peer) -> None:
        for answer in answers:
            await peer.request()
            await peer.send(answer)

    async with serve(health) as (backend, client):
        assert await client.get_json(f"{backend.url}/health?deep=1", {"x-k": "v"}, 2.0, "b1") == (
            200,
            {"ok": True, "n": [1, 2]},
        )
        assert await client.get_json(f"{backend.url}/health", {}, 2.0, "b1") == (200, None)
        assert backend.connections == 1
        request = backend.requests[0][1]
        assert request.startswith(b"GET /health?deep=1 HTTP/1.1\r\n")
        fields = headers_of(request)
        assert ("host", f"127.0.0.1:{backend.port}") in fields and ("x-k", "v") in fields
        assert "content-length" not in dict(fields)


async def test_post_json_sends_json_with_its_length() -> None:
    payload = {"model": "m", "text": "héllo", "n": [1, 2]}

    async def admin(peer: Peer) -> None:
        await peer.request()
        await peer.send(ok(b'{"done": 1}', status=b"201 Created"))

    async with serve(admin) as (backend, client):
        caller = {"Content-Length": "999", "Host": "elsewhere", "Connection": "close", "authorization": "Bearer k"}
        status, answer = await client.post_json(f"{backend.url}/admin", payload, caller, 2.0, "b1")
        assert (status, answer) == (201, {"done": 1})
        request = backend.requests[0][1]
        assert request.startswith(b"POST /admin HTTP/1.1\r\n")
        body = request.split(b"\r\n\r\n", 1)[1]
        fields = headers_of(request)
        names = [name for name, _ in fields]
        assert body == json.dumps(payload).encode() and json.loads(body) == payload
        assert ("content-type", "application/json") in fields
        assert ("content-length", str(len(body))) in fields
        assert names.count("content-length") == 1 and names.count("host") == 1 and "connection" not in names
        assert ("host", f"127.0.0.1:{backend.port}") in fields and ("authorization", "Bearer k") in fields


# -- the same on uvloop -----------------------------------------------------------------------------

ON_UVLOOP: list[Callable[[], Coroutine[Any, Any, None]]] = [
    test_a_content_length_answer_is_read_whole_and_its_connection_reused,
    test_a_chunked_answer_is_streamed_chunk_by_chunk_and_its_connection_reused,
    test_an_answer_ended_by_the_close_is_complete_and_its_connection_not_reused,
    test_a_chunked_answer_cut_by_the_close_is_a_disconnect,
    test_no_head_within_first_byte_s_is_a_timeout_and_closes_the_connection,
    test_a_pooled_connection_the_backend_closed_while_idle_is_not_used,
    test_a_pooled_connection_closed_as_the_request_went_is_retried_on_a_new_one,
    test_garbage_instead_of_a_response_is_an_upstream_error,
    test_a_reader_that_does_not_read_holds_the_backend_up,
    test_closing_an_unfinished_stream_closes_its_connection_at_once,
    test_a_spliced_stream_goes_to_its_sink_in_order_until_the_sink_steps_back,
]


@pytest.mark.parametrize("test", ON_UVLOOP, ids=[test.__name__.removeprefix("test_") for test in ON_UVLOOP])
def test_on_uvloop(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test())


def test_a_head_is_one_line_a_header_and_refuses_a_line_break_inside_one() -> None:

    good = {
        "content-type": "application/json",
        "Host": "caller.example",
        "x-request-id": "r1",
        "traceparent": "00-a-b-00",
    }
    head = _head("POST", "/v1/chat/completions", "engine:8000", good, b"{}", "b1")
    assert head == (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: engine:8000\r\ncontent-type: application/json\r\n"
        b"x-request-id: r1\r\ntraceparent: 00-a-b-00\r\ncontent-length: 2\r\n\r\n"
    )
    assert _head("GET", "/metrics", "e:1", {}, None, "b1") == b"GET /metrics HTTP/1.1\r\nhost: e:1\r\n\r\n"
    for name, value in (
        ("x-a", "v\r\nx-injected: 1"),
        ("x-a", "v\n"),
        ("x-a", "\rv"),
        ("x-a\r\nx-b", "v"),
        ("x\nb", "v"),
        ("x:b", "v"),
    ):
        with pytest.raises(UpstreamError, match="not a valid header line"):
            _head("POST", "/v1/x", "e:1", {"x-ok": "1", name: value}, b"", "b1")
    with pytest.raises(UpstreamError):
        _head("GET", "/a\r\nb", "e:1", {}, None, "b1")
