"""The abort race against a REAL vLLM (docs/reliability.md, "Leaving a vLLM stream early"): clients
leave a long stream at random times from 5 ms to 300 ms after sending it, before the first byte as
well as mid-stream, 120 times; each time the gateway must record the client leaving and close the
upstream, and vLLM must stop generating (its token counter ends short of max_tokens, and it is idle
within a second). Bounded: about two minutes on the 2-core CI machine."""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.gateway_harness import GatewayThread, engine_metric, idle_within, running_gateway

TRIES = 120
MAX_TOKENS = 2000


@pytest.fixture(scope="module")
def gateway(vllm_server: Any) -> Iterator[GatewayThread]:
    data = {
        "health": {"interval_s": 60, "scrape_interval_s": 60},
        "pools": {"vllm": {"engine": "vllm", "backends": [{"url": vllm_server.base_url, "model": "tiny"}]}},
        "routes": [{"model": "tiny", "pools": ["vllm"]}],
    }
    with running_gateway(data) as gw:
        yield gw


def _leave_after(gw: GatewayThread, seconds: float) -> int:
    """Send a long stream on a raw socket, read what comes for `seconds`, then vanish (a reset):
    the bytes read."""
    host, port = gw.base_url.removeprefix("http://").split(":")
    body = {"model": "tiny", "stream": True, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    body["messages"] = [{"role": "user", "content": "Count on, forever."}]
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(raw)}"
    )
    got = 0
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + raw)
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            got += len(chunk)
    return got


def test_clients_leaving_at_random_times_always_stop_vllm(gateway: GatewayThread, vllm_server: Any) -> None:
    metrics = vllm_server.metrics_url
    rng = random.Random(20261202)
    misses: list[tuple[float, float]] = []
    slow: list[tuple[float, float]] = []
    for _ in range(TRIES):
        delay = rng.uniform(0.005, 0.3)
        before = engine_metric(metrics, "vllm:generation_tokens_total")
        left = gateway.metric("gateway_requests_total", outcome="client_closed")
        _leave_after(gateway, delay)
        took = idle_within(lambda: engine_metric(metrics, "vllm:num_requests_running") == 0, timeout=30)
        generated = engine_metric(metrics, "vllm:generation_tokens_total") - before
        gateway.settle()
        assert gateway.metric("gateway_requests_total", outcome="client_closed") == left + 1
        if generated >= MAX_TOKENS:
            misses.append((delay, generated))
        elif took > 1.0:
            slow.append((delay, took))
    assert not misses, f"vLLM generated every token after the client left at: {misses}"
    assert not slow, f"vLLM still ran more than 1 s after the client left at: {slow}"
