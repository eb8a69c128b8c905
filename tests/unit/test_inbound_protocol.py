"""The gateway's inbound HTTP protocol (serving/protocol.py) and its cycle's receive
(serving/cycle.py), fed bytes directly: the request body whole however it arrives, uvicorn's flow
control past 64 KiB, 100-continue, pipelining, and header names written in lower case."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.asgi import ARRIVED, CLIENT_GONE
from gateway.serving.protocol import protocol_class

pytestmark = pytest.mark.unit


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.paused = False
        self.pauses = 0
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True


class Echo:
    """Answers each request with the size of the body it received and the messages it took."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        parts: list[bytes] = []
        messages = 0
        while True:
            message = await receive()
            messages += 1
            parts.append(message["body"])
            if not message["more_body"]:
                break
        body = b"".join(parts)
        self.bodies.append(body)
        answer = b"%d %d" % (len(body), messages)
        headers = [(b"Content-Type", b"text/plain"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer, "more_body": False})


async def _connect(app: Echo) -> tuple[Any, Transport]:
    config = uvicorn.Config(app, http=protocol_class(30.0), lifespan="off", log_level="warning", proxy_headers=False)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


def _request(body: bytes, extra: bytes = b"") -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n%scontent-length: %d\r\n\r\n%s" % (extra, len(body), body)


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_body_in_one_read_is_one_message_and_the_scope_is_uvicorns() -> None:
    app = Echo()
    protocol, transport = await _connect(app)
    protocol.data_received(_request(b'{"a":1}'))
    await _settle()
    assert app.bodies == [b'{"a":1}']
    assert transport.out.endswith(b"\r\n\r\n7 1")
    scope = app.scopes[0]
    assert scope["method"] == "POST" and scope["path"] == "/v1/chat/completions" and scope["query_string"] == b""
    assert scope["headers"] == [(b"host", b"x"), (b"content-length", b"7")]
    assert scope["client"] == ("127.0.0.1", 5555) and scope["server"] == ("127.0.0.1", 8080)
    assert isinstance(scope[ARRIVED], float) and scope[CLIENT_GONE] is not None


async def test_a_body_in_pieces_arrives_whole_in_order() -> None:
    app = Echo()
    protocol, transport = await _connect(app)
    body = bytes(range(256)) * 40
    request = _request(body)
    for i in range(0, len(request), 1000):
        protocol.data_received(request[i : i + 1000])
        await _settle()
    await _settle()
    assert app.bodies == [body]
    size, messages = bytes(transport.out).rsplit(b"\r\n\r\n", 1)[1].split()
    assert int(size) == len(body) and int(messages) > 1  # several reads, several messages


async def test_a_body_past_64_kib_pauses_reading_until_the_app_takes_it() -> None:
    app = Echo()
    protocol, transport = await _connect(app)
    body = b"x" * (200 * 1024)
    request = _request(body)
    protocol.data_received(request[: 100 * 1024])  # head and 100 KiB: the app has not run yet
    assert transport.pauses == 1 and transport.paused
    await _settle()
    assert not transport.paused  # receive() took the body and resumed reading
    protocol.data_received(request[100 * 1024 :])
    await _settle()
    assert app.bodies == [body]


async def test_expect_100_continue_is_answered_when_the_app_reads() -> None:
    app = Echo()
    protocol, transport = await _connect(app)
    request = _request(b"hello", b"expect: 100-continue\r\n")
    head, body = request.split(b"\r\n\r\n", 1)
    protocol.data_received(head + b"\r\n\r\n")
    await _settle()
    assert transport.out == b"HTTP/1.1 100 Continue\r\n\r\n"
    protocol.data_received(body)
    await _settle()
    assert app.bodies == [b"hello"] and transport.out.endswith(b"5 1")


async def test_pipelined_requests_are_answered_in_order_with_lower_case_names() -> None:
    app = Echo()
    protocol, transport = await _connect(app)
    protocol.data_received(_request(b"one") + _request(b"three"))
    await _settle()
    assert app.bodies == [b"one", b"three"]
    out = bytes(transport.out)
    assert out.count(b"HTTP/1.1 200 OK") == 2 and out.index(b"3 1") < out.index(b"5 1")
    assert b"content-type: text/plain\r\n" in out and b"Content-Type" not in out


async def test_after_the_whole_body_receive_waits_for_the_disconnect() -> None:
    got: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["body"] == b"hi"
        got.append((await receive())["type"])  # nothing more to read: waits, as uvicorn's does

    config = uvicorn.Config(app, http=protocol_class(30.0), lifespan="off", log_level="warning", proxy_headers=False)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    protocol.connection_made(Transport())
    protocol.data_received(_request(b"hi"))
    await _settle()
    assert got == []  # still waiting: an app looping on receive() for the disconnect does not spin
    protocol.connection_lost(None)
    await _settle()
    assert got == ["http.disconnect"]
