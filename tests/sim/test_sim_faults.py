"""Every fault knob, seen from a raw socket: delays, stalls, FIN vs RST, status/body, first-event error,
byte splits, never answering, garbage SSE, forced token counts, and where the fault spec comes from."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable

import httpx
import pytest

from engines.sim.server import SimServer
from engines.sim.text import filler_text
from tests.sim.sim_helpers import CHAT_PATH, RawConn, SimFactory, chat_body, content_of, sse_json, sse_payloads

pytestmark = pytest.mark.live

Client = Callable[[SimServer], httpx.AsyncClient]
STREAM = chat_body(max_tokens=5, stream=True)


def fault(spec: str) -> dict[str, str]:
    return {"x-sim-fault": spec}


async def open_stream(sim: SimServer, spec: str, body: dict[str, object] | None = None) -> RawConn:
    conn = await RawConn.open(sim.port)
    await conn.send("POST", CHAT_PATH, body or STREAM, fault(spec))
    return conn


async def test_headers_delay(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "headers_delay=0.3")
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(conn.reader.readexactly(1), 0.15)  # nothing at all before the delay
    status, _ = await asyncio.wait_for(conn.head(), 2)
    assert status == 200 and time.monotonic() - start >= 0.25
    await conn.close()


async def test_first_token_delay_comes_after_the_headers(make_sim: SimFactory) -> None:
    sim = await make_sim()
    start = time.monotonic()
    conn = await open_stream(sim, "first_token_delay=0.4")
    status, _ = await asyncio.wait_for(conn.head(), 2)
    headers_at = time.monotonic() - start
    first = json.loads(await asyncio.wait_for(conn.event(), 2))  # the role chunk goes with the first token
    first_at = time.monotonic() - start
    assert status == 200 and headers_at < 0.2 and first_at >= 0.35
    assert first["choices"][0]["delta"]["role"] == "assistant"
    await conn.close()


async def test_chunk_delay_spaces_content_chunks(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "chunk_delay=0.06")
    await conn.head()
    await conn.event()  # role
    times = []
    for _ in range(5):
        await asyncio.wait_for(conn.event(), 2)
        times.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.05
    await conn.close()


async def test_stall_after_keeps_the_connection_open_and_counts_the_abort(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "stall_after=2")
    await conn.head()
    events = [await conn.event() for _ in range(3)]  # role + 2 content chunks
    assert content_of([json.loads(e) for e in events]) == filler_text(2)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(conn.reader.read(1), 0.3)  # no byte, and no EOF either
    assert sim.stats.active == 1
    await conn.close()
    await sim.wait_until(lambda s: s.aborted == 1 and s.active == 0, timeout=2)


async def test_die_fin_closes_cleanly_after_k_chunks(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "die_after=2;die=fin")
    await conn.head()
    events = [json.loads(await conn.event()) for _ in range(3)]
    assert content_of(events) == filler_text(2)
    assert await asyncio.wait_for(conn.reader.read(100), 2) == b""  # FIN: EOF, no terminating chunk
    await sim.wait_until(lambda s: s.killed == 1 and s.active == 0, timeout=2)
    assert sim.stats.aborted == 0
    await conn.close()


async def test_die_rst_resets_after_k_chunks(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "die_after=2;die=rst")
    await conn.head()
    events = [json.loads(await conn.event()) for _ in range(3)]
    assert content_of(events) == filler_text(2)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(conn.reader.read(100), 2)
    await sim.wait_until(lambda s: s.killed == 1 and s.active == 0, timeout=2)
    await conn.close()


@pytest.mark.parametrize("spec", ["die_after=-1", "die_after=0"])
async def test_die_before_any_byte(make_sim: SimFactory, spec: str) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, spec, chat_body())  # non-streaming: dies before the status line
    assert await asyncio.wait_for(conn.reader.read(100), 2) == b""
    await conn.close()
    stream = await open_stream(sim, "die_after=-1")
    assert await asyncio.wait_for(stream.reader.read(100), 2) == b""
    await stream.close()
    assert sim.stats.killed == 2


async def test_die_after_all_tokens_omits_only_the_end(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "die_after=5")
    await conn.head()
    raw = b""
    while chunk := await asyncio.wait_for(conn.reader.read(65536), 2):
        raw += chunk
    assert b"[DONE]" not in raw and filler_text(1).encode() in raw
    assert not raw.endswith(b"0\r\n\r\n")
    await conn.close()


@pytest.mark.parametrize("flavour", ["vllm", "sglang", "llamacpp"])
@pytest.mark.parametrize("stream", [False, True])
async def test_status_json_with_retry_after(make_sim: SimFactory, client: Client, flavour: str, stream: bool) -> None:
    sim = await make_sim(flavour)
    r = await client(sim).post(CHAT_PATH, json=chat_body(stream=stream), headers=fault("status=503;retry_after=7"))
    assert r.status_code == 503 and r.headers["retry-after"] == "7"
    assert r.headers["content-type"].split(";")[0] == "application/json"  # llama.cpp adds a charset
    body = r.json()
    error = body if flavour == "sglang" else body["error"]
    assert error["code"] == 503 and "message" in error
    assert sim.stats.running == 0 and sim.engine.core.counters.prompt_tokens == 0  # never reached the model


async def test_status_bodies(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim()
    c = client(sim)
    html = await c.post(CHAT_PATH, json=chat_body(), headers=fault("status=502;body=html"))
    assert (html.status_code, html.headers["content-type"]) == (502, "text/html")
    assert html.text.startswith("<html>") and "502 Bad Gateway" in html.text
    truncated = await c.post(CHAT_PATH, json=chat_body(), headers=fault("status=500;body=truncated"))
    assert truncated.status_code == 500 and truncated.content.startswith(b'{"error":')
    with pytest.raises(json.JSONDecodeError):
        json.loads(truncated.content)
    empty = await c.post(CHAT_PATH, json=chat_body(), headers=fault("status=500;body=empty"))
    assert (empty.status_code, empty.content, empty.headers["content-length"]) == (500, b"", "0")
    ok_html = await c.post(CHAT_PATH, json=chat_body(), headers=fault("status=200;body=html"))
    assert ok_html.status_code == 200 and ok_html.headers["content-type"] == "text/html"


async def test_first_event_error(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim()
    r = await client(sim).post(CHAT_PATH, json=STREAM, headers=fault("first_event_error=1"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(r.content)
    first = json.loads(payloads[0])
    assert first["error"]["code"] == 500 and "choices" not in first


@pytest.mark.parametrize("body", [STREAM, chat_body(max_tokens=5)])
async def test_split_writes_byte_pieces_and_reassembles_identically(
    make_sim: SimFactory, body: dict[str, object]
) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "split=1", body)
    status, headers = await asyncio.wait_for(conn.head(), 5)
    assert status == 200
    payload = await asyncio.wait_for(conn.body(headers), 5)
    await conn.close()
    record = sim.stats.recent[-1]
    head_bytes = len("\r\n".join(f"{k}: {v}" for k, v in headers.items())) + 4
    assert record.writes >= len(payload) + head_bytes  # one write per byte
    text = filler_text(5, accented=True)
    assert "é" in text
    events = sse_json(payload) if body.get("stream") else None
    got = content_of(events) if events is not None else json.loads(payload)["choices"][0]["message"]["content"]
    assert got == text
    # The same request without the split gives the same content (the accent comes with any split).
    plain = await open_stream(sim, "split=4096", body)
    _, plain_headers = await plain.head()
    plain_payload = await plain.body(plain_headers)
    await plain.close()
    events2 = sse_json(plain_payload) if body.get("stream") else None
    got2 = content_of(events2) if events2 is not None else json.loads(plain_payload)["choices"][0]["message"]["content"]
    assert got2 == got


async def test_never_answers_and_counts_the_abort(make_sim: SimFactory) -> None:
    sim = await make_sim()
    conn = await open_stream(sim, "never=1")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(conn.reader.read(1), 0.3)
    await sim.wait_until(lambda s: s.active == 1, timeout=2)
    await conn.close()
    await sim.wait_until(lambda s: s.aborted == 1 and s.active == 0, timeout=2)
    assert sim.stats.recent[-1].disconnected_at is not None


async def test_garbage_sse(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim()
    r = await client(sim).post(CHAT_PATH, json=STREAM, headers=fault("garbage=1"))
    lines = [ln for ln in r.text.split("\n") if ln]
    assert any(not ln.startswith("data: ") for ln in lines)
    bad = 0
    for payload in sse_payloads(r.content):
        try:
            json.loads(payload)
        except json.JSONDecodeError:
            bad += payload != "[DONE]"
    assert bad == 1
    assert filler_text(5).split()[-1] in r.text  # the real content still follows


async def test_tokens_forces_output_length(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim()
    c = client(sim)
    r = (await c.post(CHAT_PATH, json=chat_body(max_tokens=10), headers=fault("tokens=3"))).json()
    assert (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]) == (3, "stop")
    r = (await c.post(CHAT_PATH, json=chat_body(max_tokens=2), headers=fault("tokens=3"))).json()
    assert (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]) == (2, "length")


async def test_bad_fault_header_is_a_400(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("llamacpp")
    r = await client(sim).post(CHAT_PATH, json=chat_body(), headers=fault("bogus=1"))
    assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]


async def test_fault_sources_server_default_header_and_runtime(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim(fault="status=500")
    c = client(sim)
    assert (await c.post(CHAT_PATH, json=chat_body())).status_code == 500
    assert (await c.post(CHAT_PATH, json=chat_body(), headers=fault("status=429"))).status_code == 429
    assert (await c.get("/health")).status_code == 200  # probes are not hit by the server-wide fault
    assert (await c.post("/sim/fault", json={"fault": "", "probe_fault": "status=503"})).status_code == 200
    assert (await c.post(CHAT_PATH, json=chat_body())).status_code == 200  # "" cleared the default
    sim.set_fault(fault="tokens=1")
    assert (await c.post(CHAT_PATH, json=chat_body())).json()["usage"]["completion_tokens"] == 1
    assert (await c.get("/health")).status_code == 503
    assert (await c.post("/sim/fault", json={"fault": "nope=1"})).status_code == 400
    with pytest.raises(ValueError):
        await make_sim(fault="status=abc")
