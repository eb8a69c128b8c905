"""The simulator's HTTP/1.1 layer over raw sockets: keep-alive, pipelining, Connection: close, chunked
framing, Expect: 100-continue and malformed requests."""

from __future__ import annotations

import asyncio

import pytest

from tests.sim.sim_helpers import CHAT_PATH, RawConn, SimFactory, chat_body, request_bytes, sse_json

pytestmark = pytest.mark.live


async def test_keep_alive_serves_several_requests_on_one_connection(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await RawConn.open(sim.port)
    for stream in (False, True, False):
        await conn.send("POST", CHAT_PATH, chat_body(max_tokens=2, stream=stream))
        status, headers, body = await asyncio.wait_for(conn.response(), 2)
        assert status == 200 and "connection" not in headers
        if stream:
            assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
            assert len(sse_json(body)) == 3
        else:
            assert int(headers["content-length"]) == len(body)
    await conn.close()
    assert sim.stats.completed == 3


async def test_pipelined_requests_are_answered_in_order(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await RawConn.open(sim.port)
    conn.writer.write(request_bytes("GET", "/nope") + request_bytes("POST", CHAT_PATH, chat_body(max_tokens=1)))
    await conn.writer.drain()
    first = await asyncio.wait_for(conn.response(), 2)
    second = await asyncio.wait_for(conn.response(), 2)
    assert (first[0], second[0]) == (404, 200)
    await conn.close()


async def test_connection_close_is_honoured(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await RawConn.open(sim.port)
    await conn.send("GET", "/health", headers={"connection": "close"})
    status, headers, _ = await asyncio.wait_for(conn.response(), 2)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(conn.reader.read(10), 2) == b""
    await conn.close()


async def test_expect_continue(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await RawConn.open(sim.port)
    body = b'{"prompt": "hi", "max_tokens": 1}'
    head = f"POST /v1/completions HTTP/1.1\r\ncontent-length: {len(body)}\r\nexpect: 100-continue\r\n\r\n"
    conn.writer.write(head.encode())
    assert await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 2) == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.writer.write(body)
    status, _, _ = await asyncio.wait_for(conn.response(), 2)
    assert status == 200
    await conn.close()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nbad header line\r\n\r\n", 400),
        (b"POST /v1/completions HTTP/1.1\r\ncontent-length: x\r\n\r\n", 400),
        (b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", 501),
        (b"GET / HTTP/1.1\r\nx: " + b"a" * 70_000, 431),
    ],
)
async def test_malformed_requests_get_an_error_and_close(make_sim: SimFactory, raw: bytes, status: int) -> None:
    sim = await make_sim("llamacpp")
    conn = await RawConn.open(sim.port)
    conn.writer.write(raw)
    got, headers, _ = await asyncio.wait_for(conn.response(), 2)
    assert got == status and headers["connection"] == "close"
    assert await asyncio.wait_for(conn.reader.read(10), 2) == b""
    await conn.close()


async def test_client_closing_mid_request_is_quietly_dropped(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await RawConn.open(sim.port)
    conn.writer.write(b"POST /v1/completions HTTP/1.1\r\ncontent-length: 100\r\n\r\n{")
    await conn.close()
    conn2 = await RawConn.open(sim.port)
    await conn2.send("GET", "/health")
    assert (await asyncio.wait_for(conn2.response(), 2))[0] == 200
    await conn2.close()
    assert sim.stats.seen == 0
