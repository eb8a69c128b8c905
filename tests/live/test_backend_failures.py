"""What counts as a backend's failure, and what is retried (docs/reliability.md defects 2, 7, 8, 13,
14): an error is judged by the engine adapter, not its raw status; a failure after the headers but
before any byte reached the client is retried; mid-stream deaths, stalls and first-event errors
count against the backend; a too-long non-stream answer is never buffered whole."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.live.conftest import Stack, StackFactory, chat, content_of, sim_params, small_window_request, sse_events

pytestmark = pytest.mark.live

_MB = 1 << 20


async def post(base: str, body: dict[str, object], fault: str = "") -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as client:
        headers = {"x-sim-fault": fault} if fault else {}
        return await client.post(base + "/v1/chat/completions", json=body, headers=headers)


def failures(stack: Stack, name: str) -> int:
    return next(b.consecutive_failures for b in stack.gateway.registry if b.name == name)


def healthy(stack: Stack, name: str) -> bool:
    return next(b.healthy for b in stack.gateway.registry if b.name == name)


async def test_an_engines_500_for_a_client_mistake_is_a_400_and_never_ejects(make_stack: StackFactory) -> None:
    """Defect 2, generic: the adapter reads the 500 first; a client's mistake is a 400, not retried,
    not counted against the backend, and six of them leave the pool and /readyz healthy."""
    stack = await make_stack(
        pools={"llama": [sim_params("llamacpp"), sim_params("llamacpp")]}, pool_llama={"balancer": "first_healthy"}
    )
    for _ in range(6):
        r = await post(stack.base_url, chat(max_tokens=2), "status=500;client_error=1")
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert stack.sims["llama-1"].stats.seen == 0  # never retried
    assert failures(stack, "llama-0") == 0 and healthy(stack, "llama-0")
    assert stack.total("gateway_upstream_errors_total") == 0
    ok = await post(stack.base_url, chat(max_tokens=2))
    assert ok.status_code == 200 and ok.headers["x-gateway-backend"] == "llama-0"
    async with httpx.AsyncClient() as client:
        ready = await client.get(stack.base_url + "/readyz")
    assert ready.status_code == 200 and ready.json()["healthy_backends"] == 2


@pytest.mark.parametrize(
    ("fault", "stream"),
    [
        ("die_after=0;die=rst", True),  # 200 SSE headers, then a reset
        ("die_after=0;die=fin", True),  # 200 SSE headers, then a clean FIN inside the chunked body
        ("empty_stream=1", True),  # 200 SSE headers and a clean, empty body
        ("short_body=1", False),  # a non-stream body cut half-way
    ],
)
async def test_a_failure_before_the_first_byte_is_retried_on_the_healthy_backend(
    make_stack: StackFactory, fault: str, stream: bool
) -> None:
    """Defect 7: the headers came, no byte reached the client: the next backend answers."""
    stack = await make_stack(
        pools={"vllm": [sim_params(fault=fault), sim_params()]}, pool_vllm={"balancer": "first_healthy"}
    )
    r = await post(stack.base_url, chat(max_tokens=4, stream=stream))
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-backend"] == "vllm-1"
    if stream:
        events = sse_events(r.content)
        assert events[-1] == "[DONE]" and content_of(events)
    else:
        assert r.json()["choices"][0]["message"]["content"]
    assert stack.sims["vllm-0"].stats.seen == 1
    assert stack.total("gateway_retries_total") == 1
    assert stack.total("gateway_upstream_errors_total", backend="vllm-0") == 1
    assert failures(stack, "vllm-0") == 1
    assert stack.total("gateway_requests_total", outcome="success") == 1


@pytest.mark.parametrize(
    ("fault", "timeouts"),
    [
        ("die_after=2", {}),  # every stream dies mid-way
        ("stall_after=1", {"idle_s": 0.3, "keepalive_s": 0}),  # every stream stalls
        ("first_event_error=1", {}),  # every stream's first event is an error
    ],
)
async def test_a_backend_that_fails_every_stream_is_ejected(
    make_stack: StackFactory, fault: str, timeouts: dict[str, float]
) -> None:
    """Defect 8: success is a whole answer, not a 200; five failed streams eject the backend."""
    stack = await make_stack(
        pools={"vllm": [sim_params(fault=fault), sim_params()]},
        pool_vllm={"balancer": "first_healthy"},
        timeouts=timeouts,
    )
    for _ in range(5):
        r = await post(stack.base_url, chat(max_tokens=8, stream=True))
        assert r.status_code == 200
    assert not healthy(stack, "vllm-0")
    assert stack.metric("gateway_backend_up", pool="vllm", backend="vllm-0", engine="sim") == 0
    seen = stack.sims["vllm-0"].stats.seen
    r = await post(stack.base_url, chat(max_tokens=8, stream=True))
    assert r.headers["x-gateway-backend"] == "vllm-1" and sse_events(r.content)[-1] == "[DONE]"
    assert stack.sims["vllm-0"].stats.seen == seen  # out of rotation


async def test_a_client_that_stops_reading_is_not_the_backends_failure(make_stack: StackFactory) -> None:
    """Defect 8's other half: an idle cut while the backend's bytes wait unread is the client's."""

    stack = await make_stack(
        pools={
            "vllm": [
                sim_params(base_step_s=1e-5, per_seq_step_s=0.0, context_limit=1_000_000, kv_budget_tokens=10_000_000)
            ]
        },
        timeouts={"idle_s": 0.5, "keepalive_s": 0},
    )
    sock = await small_window_request(stack.base_url, chat(stream=True, max_tokens=100_000))
    try:
        await stack.wait_metric("gateway_requests_total", 1, timeout=30, outcome="timeout_idle")
    finally:
        sock.close()
    assert failures(stack, "vllm-0") == 0


async def test_headers_without_a_first_chunk_before_the_keepalive_is_504(make_stack: StackFactory) -> None:
    """Defect 13: first_byte_s < keepalive_s: no ping was due, so the client gets a plain 504."""
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="first_token_delay=3")]},
        timeouts={"first_byte_s": 0.4, "keepalive_s": 5},
    )
    r = await post(stack.base_url, chat(max_tokens=4, stream=True))
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert stack.total("gateway_requests_total", outcome="timeout_ttfb") == 1
    assert failures(stack, "vllm-0") == 1


@contextlib.asynccontextmanager
async def huge_body_engine(total: int, declare: bool) -> AsyncIterator[str]:
    """A raw engine that answers any POST with a 200 JSON body of `total` bytes, written 1 MiB at a
    time from one buffer (so the test process holds no copy of it)."""
    piece = b" " * _MB

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"POST"):  # the start-up health check
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                await writer.drain()
                writer.close()
                return
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            framing = f"content-length: {total}" if declare else "transfer-encoding: chunked"
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}\r\n\r\n".encode())
            for _ in range(total // _MB):
                writer.write(piece if declare else b"%x\r\n" % _MB + piece + b"\r\n")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("declare", [False, True], ids=["chunked", "content_length"])
async def test_a_200_mb_answer_is_a_502_and_memory_stays_bounded(make_stack: StackFactory, declare: bool) -> None:
    """Defect 14: the body is read up to limits.max_response_bytes, then a 502 in OpenAI shape, and a
    failure for the backend; the gateway's peak RSS does not grow by the answer's size."""
    async with huge_body_engine(200 * _MB, declare) as url:
        stack = await make_stack(pools={"vllm": [url]}, limits={"max_response_bytes": 8 * _MB})
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to the current RSS
        before = peak_rss_mb()
        r = await post(stack.base_url, chat(max_tokens=4))
        grown = peak_rss_mb() - before
    print(f"200 MB upstream answer ({'declared' if declare else 'chunked'}): peak RSS +{grown:.0f} MB")
    assert r.status_code == 502
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "response_too_large"
    assert stack.total("gateway_upstream_errors_total", kind="too_large") == 1
    assert failures(stack, "vllm-0") == 1
    assert grown < 60, f"peak RSS grew {grown:.0f} MB"
