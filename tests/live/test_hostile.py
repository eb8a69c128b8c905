"""Hostile clients and broken engines (docs/reliability.md): each test is one defect
found by attacking the gateway, reproduced over real sockets against a real uvicorn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from aiohttp import web

from tests.live.conftest import StackFactory, chat, raw_request

pytestmark = pytest.mark.live


@dataclass
class Broken:
    """What the broken engine answers every completion with: `{auth}` in the message becomes the
    Authorization header it received; `stream_error` answers a 200 stream whose first event is it."""

    status: int = 429
    message: str = "slow down"
    headers: dict[str, str] = field(default_factory=dict)
    stream_error: bool = False
    seen: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def broken_engine() -> AsyncIterator[tuple[str, Broken]]:
    """An emulator of a broken engine (not the simulator): healthy, but every completion gets the
    error the test sets up."""
    broken = Broken()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    async def complete(request: web.Request) -> web.StreamResponse:
        await request.read()
        broken.seen.append(dict(request.headers))
        message = broken.message.replace("{auth}", request.headers.get("authorization", ""))
        body = {"error": {"message": message, "type": "error", "code": broken.status}}
        if broken.stream_error:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")
            return resp
        return web.json_response(body, status=broken.status, headers=broken.headers)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", broken
    await runner.cleanup()


@pytest.mark.parametrize("value", ["inf", "1e999", "-inf", "nan", "1e300", "Wed, 21 Oct 2015 07:28:00 GMT"])
async def test_a_backends_absurd_retry_after_is_clamped(
    make_stack: StackFactory, broken_engine: tuple[str, Broken], value: str
) -> None:
    """Defect 10: `Retry-After: inf` crashed round() and gave a text/plain 500."""
    url, broken = broken_engine
    broken.headers["retry-after"] = value
    stack = await make_stack(pools={"vllm": [url]}, retry={"max_attempts": 1})
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.post(stack.base_url + "/v1/chat/completions", json=chat(max_tokens=1))
    assert r.status_code == 429 and r.headers["content-type"] == "application/json"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert 1 <= int(r.headers["retry-after"]) <= 3600


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/chat/completions/"), ("GET", "/v1/models/"), ("GET", "/healthz/")]
)
async def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_host_header(
    make_stack: StackFactory, method: str, path: str
) -> None:
    """Defect 11: Starlette's slash redirect answered 307 to http://evil.example/... ."""
    stack = await make_stack()
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.request(method, stack.base_url + path, json=chat(), headers={"host": "evil.example"})
    assert r.status_code == 404 and "location" not in r.headers
    assert r.json()["error"]["code"] == "not_found"
    assert stack.sims["vllm-0"].stats.seen == 0


async def test_json_amplification_is_400_and_never_reaches_the_engine(make_stack: StackFactory) -> None:
    """Defect 4: 3.4 million `{}` in an ignored field, under the 10 MiB body limit, were parsed
    (500 MB, 4.5 s of CPU) and forwarded."""
    stack = await make_stack()
    body = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"x":[' + b",".join([b"{}"] * 3_400_000) + b"]}"
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(stack.base_url + "/v1/chat/completions", content=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_many_nodes"
        ok = await client.post(stack.base_url + "/v1/chat/completions", json=chat(max_tokens=1))
    assert ok.status_code == 200 and stack.sims["vllm-0"].stats.seen == 1


@pytest.mark.parametrize(("status", "stream"), [(400, False), (404, False), (500, False), (502, False), (400, True)])
async def test_an_engine_quoting_its_credentials_leaks_nothing(
    make_stack: StackFactory, broken_engine: tuple[str, Broken], status: int, stream: bool
) -> None:
    """Defect 9: an engine error that quoted the Authorization it received reached the client."""
    url, broken = broken_engine
    broken.status, broken.stream_error = status, stream
    broken.message = "bad request; you sent Authorization: {auth} and api_key=sk-proj-abcdefghijklmnop"
    stack = await make_stack(pools={"vllm": [url]}, retry={"max_attempts": 1})
    stack.gateway.registry.by_name["vllm-0"].api_key = "upstream-secret-42"
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.post(stack.base_url + "/v1/chat/completions", json=chat(max_tokens=1, stream=stream))
    assert broken.seen and broken.seen[-1]["Authorization"] == "Bearer upstream-secret-42"
    assert r.status_code >= 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "upstream-secret-42" not in r.text and "sk-proj-abcdefghijklmnop" not in r.text
    assert "[redacted]" in r.text


async def test_only_safe_headers_reach_the_engine_and_unchanged(make_stack: StackFactory) -> None:
    """Defect 12: Content-Encoding on a plain body (llama-server then answers 415), other
    credential headers beside the gateway's key, and non-ASCII values double-encoded."""
    stack = await make_stack()
    dropped = {
        "content-encoding": "gzip",
        "openai-organization": "org-1",
        "openai-project": "proj-1",
        "x-goog-api-key": "g",
        "anthropic-api-key": "a",
        "x-auth-token": "t",
        "x-real-ip": "10.0.0.1",
    }
    body = json.dumps(chat(max_tokens=1)).encode()
    reader, writer = await raw_request(
        stack.base_url, "/v1/chat/completions", body, {**dropped, "x-note": "café", "x-keep": "yes"}
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    seen = stack.sims["vllm-0"].stats.recent[-1].headers
    for name in dropped:
        assert name not in seen, name
    assert seen["x-keep"] == "yes"
    assert seen["x-note"].encode("latin-1") == "café".encode()  # the client's bytes, not cafÃ©
