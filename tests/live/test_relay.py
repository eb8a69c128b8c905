"""Streaming and non-streaming relay through a real uvicorn server, with the official openai
client and with raw HTTP, against simulated engines."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from gateway.upstream.client import UpstreamResponse
from tests.live.conftest import StackFactory, chat, content_of, sim_params, small_window_request, sse_events

pytestmark = pytest.mark.live


async def test_openai_client_chat_completions_embeddings_models(make_stack: StackFactory) -> None:
    stack = await make_stack()
    client = openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="client-key", max_retries=0)
    reply = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    comp = await client.completions.create(model="tiny", prompt="once upon", max_tokens=3)
    assert comp.usage is not None and comp.usage.completion_tokens == 3
    emb = await client.embeddings.create(model="tiny", input="hello")
    assert len(emb.data[0].embedding) > 0
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    await client.close()
    assert stack.total("gateway_requests_total", outcome="success") == 4
    assert stack.total("gateway_output_tokens_total", source="usage") == 15


async def test_stream_bytes_are_relayed_unchanged(make_stack: StackFactory) -> None:
    """With include_usage asked by the client, the gateway is a pure byte pipe: the same events,
    split one byte per write upstream (inside UTF-8 characters too), arrive intact."""
    stack = await make_stack()
    body = chat(stream=True, max_tokens=20, stream_options={"include_usage": True})
    async with httpx.AsyncClient() as client:
        direct = await client.post(
            stack.sims["vllm-0"].base_url + "/v1/chat/completions", json=body, headers={"x-sim-fault": "split=1"}
        )
        via = await client.post(stack.base_url + "/v1/chat/completions", json=body, headers={"x-sim-fault": "split=1"})
    assert via.status_code == 200
    assert via.headers["content-type"].startswith("text/event-stream")
    assert via.headers["cache-control"] == "no-cache" and via.headers["x-accel-buffering"] == "no"
    d, v = sse_events(direct.content), sse_events(via.content)
    assert len(d) == len(v) and v[-1] == "[DONE]"
    assert content_of(d) == content_of(v) and "é" in content_of(v)
    strip = [json.loads(e) | {"id": "", "created": 0} for e in v[:-1]]
    orig = [json.loads(e) | {"id": "", "created": 0} for e in d[:-1]]
    assert strip == orig


async def test_injected_usage_is_counted_and_stripped(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient() as client:
        # 30 ms between chunks, so that each content chunk reaches the gateway in a read of its own:
        # ITL gaps are measured between reads.
        r = await client.post(
            stack.base_url + "/v1/chat/completions",
            json=chat(stream=True, max_tokens=6),
            headers={"x-sim-fault": "chunk_delay=0.03"},
        )
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    assert not any('"choices":[]' in e for e in events)  # the usage chunk the gateway added is gone
    upstream = stack.sims["vllm-0"].stats.recent[-1].body
    assert upstream["stream_options"] == {"include_usage": True}
    assert stack.total("gateway_output_tokens_total", source="usage") == 6
    assert stack.total("gateway_time_to_first_token_seconds_count") == 1
    assert stack.total("gateway_inter_token_latency_seconds_count") == 5


async def test_response_says_where_it_went(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient() as client:
        r = await client.post(
            stack.base_url + "/v1/chat/completions", json=chat(max_tokens=2), headers={"x-request-id": "my-id-1"}
        )
    assert r.headers["x-gateway-pool"] == "vllm"
    assert r.headers["x-gateway-backend"] == "vllm-0"
    assert r.headers["x-gateway-rule"] == "default"
    assert r.headers["x-request-id"] == "my-id-1"
    assert stack.sims["vllm-0"].stats.recent[-1].headers["x-request-id"] == "my-id-1"


async def test_credentials_and_hop_by_hop_headers_never_reach_the_backend(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"vllm": [sim_params()]})
    async with httpx.AsyncClient() as client:
        r = await client.post(
            stack.base_url + "/v1/chat/completions",
            json=chat(max_tokens=1, api_base="http://evil.example"),
            headers={
                "authorization": "Bearer client-secret",
                "cookie": "c=1",
                "x-api-key": "k2",
                "proxy-authorization": "p",
                "connection": "x-foo",
                "x-foo": "bar",
                "x-keep": "yes",
            },
        )
    assert r.status_code == 200
    seen = stack.sims["vllm-0"].stats.recent[-1]
    headers = seen.headers
    for name in ("authorization", "cookie", "x-api-key", "proxy-authorization", "x-foo"):
        assert name not in headers, name
    assert headers["x-keep"] == "yes"
    assert "api_base" not in seen.body


async def test_backend_key_is_sent(make_stack: StackFactory) -> None:
    stack = await make_stack()
    # Rebuild with a key: the key lives in config, so use the factory's pool extras.
    sim = stack.sims["vllm-0"]
    keyed = await make_stack(pools={"vllm": [sim_params()]})
    keyed.gateway.registry.by_name["vllm-0"].api_key = "backend-secret"
    async with httpx.AsyncClient() as client:
        r = await client.post(
            keyed.base_url + "/v1/chat/completions",
            json=chat(max_tokens=1),
            headers={"authorization": "Bearer client-secret"},
        )
    assert r.status_code == 200
    assert keyed.sims["vllm-0"].stats.recent[-1].headers["authorization"] == "Bearer backend-secret"
    assert sim.stats.seen == 0


async def test_upstream_model_name_is_rewritten(make_stack: StackFactory) -> None:
    stack = await make_stack(routes=[{"model": "public-name", "pools": ["vllm"]}])
    async with httpx.AsyncClient() as client:
        r = await client.post(stack.base_url + "/v1/chat/completions", json=chat(model="public-name", max_tokens=1))
    assert r.status_code == 200
    assert stack.sims["vllm-0"].stats.recent[-1].body["model"] == "tiny"


async def test_output_tokens_are_counted_while_a_stream_flows(make_stack: StackFactory) -> None:
    """rate(gateway_output_tokens_total) must show a long answer's tokens as they flow, not all at
    its end; the final total is still the engine's usage figure, counted once."""
    import asyncio

    stack = await make_stack()
    async with httpx.AsyncClient(timeout=20) as client:
        task = asyncio.create_task(
            client.post(
                stack.base_url + "/v1/chat/completions",
                json=chat(stream=True, max_tokens=100),
                headers={"x-sim-fault": "chunk_delay=0.01"},
            )
        )
        await stack.wait_metric("gateway_output_tokens_total", 32, timeout=5)
        assert not task.done()  # counted mid-stream
        await task
    await stack.wait_metric("gateway_requests_total", 1, outcome="success")
    assert stack.total("gateway_output_tokens_total") == 100


async def test_metrics_page_is_gzipped_when_the_scraper_accepts_it(make_stack: StackFactory) -> None:
    """/metrics with Accept-Encoding: gzip (as Prometheus sends) is the same page, gzipped; without
    it, the plain text."""
    stack = await make_stack()
    async with httpx.AsyncClient() as client:
        await client.post(stack.base_url + "/v1/chat/completions", json=chat(max_tokens=2))
        plain = await client.get(stack.base_url + "/metrics", headers={"accept-encoding": "identity"})
        packed = await client.get(stack.base_url + "/metrics", headers={"accept-encoding": "gzip"})
    assert plain.status_code == packed.status_code == 200
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "gzip"
    assert int(packed.headers["content-length"]) * 5 < len(plain.content)  # httpx decoded it
    assert plain.text.startswith("# HELP")

    def series(text: str) -> list[str]:  # the sample names and labels (ages and gauges move between scrapes)
        return [line.rsplit(" ", 1)[0] for line in text.splitlines()]

    assert series(packed.text) == series(plain.text)
    done = [line for line in packed.text.splitlines() if line.startswith("gateway_requests_total{")]
    assert done == [line for line in plain.text.splitlines() if line.startswith("gateway_requests_total{")]
    assert done and done[0].endswith(" 1.0")


async def test_a_streams_middle_is_relayed_without_waking_the_request_task(
    make_stack: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's server offers a chunk writer (asgi.BODY_WRITER), and the relay hands it each
    chunk from the upstream connection's callback: the request's task reads the first chunk and the
    end, not each of the 30 chunks in between (docs/design.md, "The relay")."""
    reads = 0
    readany = UpstreamResponse.readany

    async def counted(self: UpstreamResponse) -> bytes:
        nonlocal reads
        reads += 1
        return await readany(self)

    monkeypatch.setattr(UpstreamResponse, "readany", counted)
    stack = await make_stack()
    body = chat(stream=True, max_tokens=30, stream_options={"include_usage": True})
    async with httpx.AsyncClient() as client:
        direct = await client.post(
            stack.sims["vllm-0"].base_url + "/v1/chat/completions",
            json=body,
            headers={"x-sim-fault": "chunk_delay=0.005"},
        )
        reads = 0
        via = await client.post(
            stack.base_url + "/v1/chat/completions", json=body, headers={"x-sim-fault": "chunk_delay=0.005"}
        )
    d, v = sse_events(direct.content), sse_events(via.content)
    assert content_of(v) == content_of(d) and v[-1] == "[DONE]" and len(v) == len(d)
    assert reads <= 3, f"the request task read {reads} times: the stream went chunk by chunk through it"
    assert stack.total("gateway_output_tokens_total", source="usage") == 30


async def test_a_client_that_reads_slowly_gets_the_whole_stream_in_order(make_stack: StackFactory) -> None:
    """Flow control on the direct path: a client that stops reading for a while fills its socket;
    the relay steps back to `send` (which waits for the drain), then takes the direct path again.
    Not a byte is lost, doubled or reordered."""
    stack = await make_stack(
        pools={
            "vllm": [
                sim_params(base_step_s=1e-5, per_seq_step_s=0.0, context_limit=1_000_000, kv_budget_tokens=10_000_000)
            ]
        },
        timeouts={"idle_s": 30, "keepalive_s": 0},
    )
    body = chat(stream=True, max_tokens=20_000, stream_options={"include_usage": True})
    async with httpx.AsyncClient(timeout=60) as client:
        direct = await client.post(stack.sims["vllm-0"].base_url + "/v1/chat/completions", json=body)
    sock = await small_window_request(stack.base_url, body)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(1.0)  # not reading: the gateway's writes back up
    received = bytearray()
    try:
        async with asyncio.timeout(60):
            while not received.endswith(b"\r\n0\r\n\r\n"):
                data = await loop.sock_recv(sock, 65536)
                assert data, "the gateway closed the connection before the stream's end"
                received += data
                if len(received) % 7 == 0:
                    await asyncio.sleep(0.001)  # and reads slowly after
    finally:
        sock.close()
    head_end = received.index(b"\r\n\r\n") + 4
    assert received[:head_end].startswith(b"HTTP/1.1 200")
    payload = _unchunk(bytes(received[head_end:]))
    d, v = sse_events(direct.content), sse_events(payload)
    assert len(v) == len(d) and v[-1] == "[DONE]"
    assert content_of(v) == content_of(d)
    await stack.wait_metric("gateway_requests_total", 1, timeout=10, outcome="success")


def _unchunk(data: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        line_end = data.index(b"\r\n", at)
        size = int(data[at:line_end], 16)
        if size == 0:
            return bytes(out)
        out += data[line_end + 2 : line_end + 2 + size]
        assert data[line_end + 2 + size : line_end + 4 + size] == b"\r\n"
        at = line_end + 4 + size


async def test_a_finished_request_is_freed_without_the_cycle_collector(make_stack: StackFactory) -> None:
    """Nothing in a request's scope points back at its cycle (the chunk writer holds the transport
    and the flow only): each finished request is freed by reference counting when the next one on
    the connection replaces it. The gateway's GC runs rarely (gc.freeze, a high threshold), so a
    reference cycle a request would keep every request's scope and buffers until a collection."""
    import gc

    from gateway.serving.cycle import GatewayCycle

    stack = await make_stack()
    body = chat(stream=True, max_tokens=5)
    async with httpx.AsyncClient() as client:
        await client.post(stack.base_url + "/v1/chat/completions", json=body)
        gc.collect()
        gc.disable()
        try:
            before = sum(isinstance(o, GatewayCycle) for o in gc.get_objects())
            for _ in range(20):
                r = await client.post(stack.base_url + "/v1/chat/completions", json=body)
                assert r.status_code == 200 and sse_events(r.content)[-1] == "[DONE]"
            after = sum(isinstance(o, GatewayCycle) for o in gc.get_objects())
        finally:
            gc.enable()
    assert after - before < 5, f"{after - before} finished cycles wait for the collector"
