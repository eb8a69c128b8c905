"""Bad input over real HTTP: OpenAI-shaped errors with the right status, nothing reaches a
backend, and no client string becomes a metric label (docs/reliability.md 4.3 and invariant 0.4)."""

from __future__ import annotations

import asyncio
import json
import random
import string
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.live.conftest import StackFactory, chat

pytestmark = pytest.mark.live


def shaped(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]  # type: ignore[no-any-return]


async def test_bad_bodies_get_400s_and_never_reach_the_engine(make_stack: StackFactory) -> None:
    stack = await make_stack()
    url = stack.base_url + "/v1/chat/completions"
    async with httpx.AsyncClient() as client:
        for raw in (b"{bad", b"[]", b"", b"a=b", b'{"model":"tiny","x":' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
            shaped(await client.post(url, content=raw, headers={"content-type": "text/plain"}), 400)
        err = shaped(await client.post(url, json=chat(max_tokens=-1)), 400)
        assert err["param"] == "max_tokens"
        err = shaped(await client.post(url, json={"model": "tiny", "messages": "x"}), 400)
        assert err["param"] == "messages"
    assert stack.sims["vllm-0"].stats.seen == 0
    assert stack.total("gateway_requests_total", outcome="rejected_4xx") == 7


async def test_body_too_large_is_413(make_stack: StackFactory) -> None:
    stack = await make_stack(limits={"max_body_bytes": 4096})
    url = stack.base_url + "/v1/chat/completions"
    async with httpx.AsyncClient() as client:
        shaped(await client.post(url, json=chat(content="x" * 5000)), 413)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(100):
                yield b"x" * 1000

        shaped(await client.post(url, content=chunks()), 413)
    assert stack.sims["vllm-0"].stats.seen == 0


async def test_unknown_model_is_404_and_labels_stay_bounded(make_stack: StackFactory) -> None:
    stack = await make_stack()
    url = stack.base_url + "/v1/chat/completions"
    rng = random.Random(7)
    async with httpx.AsyncClient() as client:
        err = shaped(await client.post(url, json=chat(model="nope")), 404)
        assert err["code"] == "model_not_found"
        names = ["".join(rng.choices(string.ascii_letters, k=12)) for _ in range(300)]
        await asyncio.gather(*(client.post(url, json=chat(model=n), headers={"x-random": n}) for n in names))
        text = (await client.get(stack.base_url + "/metrics")).text
    for name in names:
        assert name not in text
    routes = {labels["route"] for labels, _ in stack.samples("gateway_requests_total")}
    assert routes == {"__unknown__"}


async def test_wrong_method_and_path(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient() as client:
        shaped(await client.get(stack.base_url + "/v1/chat/completions"), 405)
        shaped(await client.post(stack.base_url + "/v1/nope", json={}), 404)
        shaped(await client.get(stack.base_url + "/v1/../admin"), 404)


async def test_client_auth(make_stack: StackFactory) -> None:
    stack = await make_stack(server={"api_keys": ["sk-good"]})
    url = stack.base_url + "/v1/chat/completions"
    async with httpx.AsyncClient() as client:
        for headers in ({}, {"authorization": "Bearer sk-bad"}, {"authorization": "sk-good"}):
            err = shaped(await client.post(url, json=chat(), headers=headers), 401)
            assert "sk-bad" not in str(err["message"])
        ok = await client.post(url, json=chat(max_tokens=1), headers={"authorization": "Bearer sk-good"})
        shaped(await client.get(stack.base_url + "/v1/models"), 401)
        models = await client.get(stack.base_url + "/v1/models", headers={"authorization": "Bearer sk-good"})
        assert models.status_code == 200
        for probe in ("/healthz", "/health"):  # probes stay open; /health is vLLM's and guidellm's name
            live = await client.get(stack.base_url + probe)
            assert live.status_code == 200 and live.json() == {"status": "ok"}
    assert ok.status_code == 200
    assert "authorization" not in stack.sims["vllm-0"].stats.recent[-1].headers


@pytest.mark.slow
async def test_ten_thousand_random_models_add_no_series(make_stack: StackFactory) -> None:
    """The cardinality check: 10,000 requests with random model names and headers leave the
    set of exported series exactly as a handful of known requests left it."""
    stack = await make_stack()
    url = stack.base_url + "/v1/chat/completions"
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as client:
        await client.post(url, json=chat(model="nope"))
        await client.post(url, json=chat(max_tokens=1))
        before = {
            line.split(" ")[0]
            for line in (await client.get(stack.base_url + "/metrics")).text.splitlines()
            if line and not line.startswith("#")
        }
        rng = random.Random(11)
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            name = "".join(rng.choices(string.ascii_letters + string.digits + "-_.:/", k=rng.randint(1, 200)))
            async with sem:
                r = await client.post(url, json=chat(model=name), headers={f"x-h{i % 50}": name})
            assert r.status_code == 404

        await asyncio.gather(*(one(i) for i in range(10_000)))
        after = {
            line.split(" ")[0]
            for line in (await client.get(stack.base_url + "/metrics")).text.splitlines()
            if line and not line.startswith("#")
        }
    # The engine-load series (gateway_backend_*) appear when a scrape comes due, which a loaded
    # machine can reach during the 10,000 requests; their labels come from the config, never
    # from a client, so they are left out of the comparison.
    assert {s for s in after if not s.startswith("gateway_backend_")} == {
        s for s in before if not s.startswith("gateway_backend_")
    }
    assert stack.total("gateway_requests_total", route="__unknown__") == 10_001


async def test_slowloris_is_cut_at_the_request_deadline(make_stack: StackFactory) -> None:
    """docs/reliability.md item 52: a client that sends its headers a byte at a time loses its connection at
    server.request_timeout_s, while a normal client is served meanwhile."""
    stack = await make_stack(server={"request_timeout_s": 1.0})
    host, port = stack.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def drip() -> None:
        try:
            for byte in b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 1000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        except (ConnectionError, OSError):
            return  # the gateway hung up on us: the point of the test

    dripping = asyncio.create_task(drip())
    async with httpx.AsyncClient() as client:
        ok = await client.post(stack.base_url + "/v1/chat/completions", json=chat(max_tokens=1))
    assert ok.status_code == 200
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # closed, no response
    assert loop.time() - started < 3
    dripping.cancel()
    await asyncio.gather(dripping, return_exceptions=True)
    writer.close()


async def test_slow_second_request_on_a_kept_alive_connection_is_cut(make_stack: StackFactory) -> None:
    """The request deadline is armed again for each request on a kept-alive connection (it is armed
    once a request spans more than one read): a whole first request is served, a second one sent a
    byte at a time loses the connection at server.request_timeout_s."""
    stack = await make_stack(server={"request_timeout_s": 1.0})
    host, port = stack.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(chat(max_tokens=1)).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert head.startswith(b"HTTP/1.1 200")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await asyncio.wait_for(reader.readexactly(length), timeout=5)
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def drip() -> None:
        try:
            for byte in b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 1000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        except (ConnectionError, OSError):
            return

    dripping = asyncio.create_task(drip())
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # closed, no response
    assert loop.time() - started < 3
    dripping.cancel()
    await asyncio.gather(dripping, return_exceptions=True)
    writer.close()
