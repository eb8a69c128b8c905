"""A client connection kept alive and left idle is closed after the keep-alive limit (one shared
timer for every idle connection, serving/protocol.py), and not before; a request in time keeps it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.live.conftest import StackFactory, chat, raw_request

pytestmark = pytest.mark.live


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


async def test_an_idle_kept_alive_connection_is_closed_at_the_limit(make_stack: StackFactory) -> None:
    stack = await make_stack()
    stack.server.config.timeout_keep_alive = 1  # read by each new connection
    body = json.dumps(chat(max_tokens=2)).encode()
    reader, writer = await raw_request(stack.base_url, "/v1/chat/completions", body)
    assert b" 200 " in (await read_response(reader)).split(b"\r\n", 1)[0]
    await asyncio.sleep(0.6)  # within the limit: a second request on the same connection is served
    head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    assert b" 200 " in (await read_response(reader)).split(b"\r\n", 1)[0]
    done = time.monotonic()
    async with asyncio.timeout(3):
        assert await reader.read(1) == b""  # then idle: the gateway closes it
    waited = time.monotonic() - done
    assert 0.99 <= waited < 1.6, waited
    writer.close()


async def test_a_stray_line_end_does_not_keep_an_idle_connection_open(make_stack: StackFactory) -> None:
    """Bytes that begin no request (a CRLF, which HTTP parsers skip) do not clear the keep-alive limit."""
    stack = await make_stack()
    stack.server.config.timeout_keep_alive = 1
    reader, writer = await raw_request(stack.base_url, "/v1/chat/completions", json.dumps(chat(max_tokens=2)).encode())
    assert b" 200 " in (await read_response(reader)).split(b"\r\n", 1)[0]
    await asyncio.sleep(0.3)
    writer.write(b"\r\n")
    done = time.monotonic()
    async with asyncio.timeout(3):
        assert await reader.read(1) == b""
    assert time.monotonic() - done < 1.2
    writer.close()
