"""The gateway's response writer (serving/cycle.py): uvicorn's framing, with the head and the first
body message in one write, and uvicorn's header checks."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.asgi import BODY_WRITER, ChunkWriter
from gateway.serving.cycle import GatewayCycle

pytestmark = pytest.mark.unit


class Transport:
    """Records each write (one write is one send syscall on a real socket)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(transport: Transport, keep_alive: bool = True) -> GatewayCycle:
    scope: Any = {"type": "http", "method": "POST", "path": "/", "headers": [], "http_version": "1.1"}
    log = logging.getLogger("test")
    return GatewayCycle(
        scope=scope,
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=log,
        access_logger=log,
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )


async def test_a_whole_answer_is_one_write() -> None:
    transport = Transport()
    c = cycle(transport)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    await c.send({"type": "http.response.start", "status": 200, "headers": headers})
    assert transport.writes == []  # the head waits for the body
    await c.send({"type": "http.response.body", "body": b"{}", "more_body": False})
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"]
    assert c.response_complete and not transport.closed


async def test_a_stream_is_chunked_and_its_head_goes_with_the_first_chunk() -> None:
    transport = Transport()
    c = cycle(transport, keep_alive=False)
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await c.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await c.send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
    await c.send({"type": "http.response.body", "body": b"", "more_body": False})
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    assert transport.writes == [head + b"9\r\ndata: 1\n\n\r\n", b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]
    assert transport.closed  # keep-alive off: closed once complete


@pytest.mark.parametrize(
    ("name", "value"),
    [(b"x-a", b"one\r\nx-b: two"), (b"x-a", b"nul\x00"), (b"x a", b"v"), (b"x:a", b"v"), (b"x-\x7f", b"v")],
)
async def test_a_header_that_could_split_the_head_is_refused(name: bytes, value: bytes) -> None:
    transport = Transport()
    c = cycle(transport)
    with pytest.raises(RuntimeError, match="Invalid HTTP header"):
        await c.send({"type": "http.response.start", "status": 200, "headers": [(name, value)]})
    assert transport.writes == []


async def test_a_tab_in_a_value_is_allowed_and_a_short_body_is_an_error() -> None:
    transport = Transport()
    c = cycle(transport)
    headers = [(b"x-a", b"a\tb"), (b"content-length", b"5")]
    await c.send({"type": "http.response.start", "status": 200, "headers": headers})
    with pytest.raises(RuntimeError, match="shorter than Content-Length"):
        await c.send({"type": "http.response.body", "body": b"abc", "more_body": False})


async def test_a_chunk_writer_is_offered_once_a_chunked_head_is_out_and_writes_like_send() -> None:
    transport = Transport()
    c = cycle(transport)
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    assert BODY_WRITER not in c.scope  # the head waits for the first body message
    await c.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    writer = c.scope[BODY_WRITER]  # type: ignore[literal-required]
    assert isinstance(writer, ChunkWriter) and writer.write(b"data: 2\n\n")
    await c.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert transport.writes[1:] == [b"9\r\ndata: 2\n\n\r\n", b"0\r\n\r\n"]  # what send() would have written
    assert not any(v is c or getattr(v, "__self__", None) is c for v in c.scope.values())  # no scope -> cycle cycle


async def test_no_chunk_writer_for_a_content_length_answer_or_a_head_request() -> None:
    c = cycle(Transport())
    await c.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
    await c.send({"type": "http.response.body", "body": b"ab", "more_body": True})
    assert BODY_WRITER not in c.scope
    head = cycle(Transport())
    head.scope["method"] = "HEAD"
    await head.send({"type": "http.response.start", "status": 200, "headers": []})
    await head.send({"type": "http.response.body", "body": b"", "more_body": True})
    assert BODY_WRITER not in head.scope


class _Flow:
    write_paused = False


def test_a_chunk_writer_frames_each_chunk_and_refuses_while_paused_or_gone() -> None:
    transport, flow = Transport(), _Flow()
    writer = ChunkWriter(transport, flow)
    assert writer.write(b"data: 1\n\n") and writer.write(b"")
    assert transport.writes == [b"9\r\ndata: 1\n\n\r\n"]  # an empty body writes nothing (it would end the body)
    flow.write_paused = True
    assert not writer.write(b"data: 2\n\n")
    flow.write_paused = False
    transport.close()
    assert not writer.write(b"data: 3\n\n")
    assert transport.writes == [b"9\r\ndata: 1\n\n\r\n"]
