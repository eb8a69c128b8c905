"""The request's clock starts when its first byte arrives (serving/protocol.py stamps it), not when
its task first runs (after the whole head is parsed): a head that arrives in two parts 0.3 s apart
is counted in the request's duration and TTFT, as the client's own clock counts it."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.live.conftest import StackFactory, chat

pytestmark = pytest.mark.live


async def test_the_clock_starts_at_the_first_byte(make_stack: StackFactory) -> None:
    stack = await make_stack()
    body = json.dumps(chat(stream=True, max_tokens=3)).encode()
    host, port = stack.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    raw = (head + f"content-length: {len(body)}\r\n\r\n").encode() + body
    writer.write(raw[:10])  # the request line, unfinished
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.write(raw[10:])
    await writer.drain()
    answer = b""
    while b"[DONE]" not in answer:
        answer += await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    await stack.wait_metric("gateway_requests_total", 1, outcome="success")
    fine = {"route": "tiny", "pool": "vllm", "api": "chat"}
    assert stack.metric("gateway_request_duration_seconds_sum", **fine) >= 0.3
    assert stack.metric("gateway_time_to_first_token_seconds_sum", **fine) >= 0.3
