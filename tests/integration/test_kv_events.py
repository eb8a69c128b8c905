"""The kv_events balancer on two REAL vLLM CPU replicas started with `--kv-events-config`: the gateway
subscribes to both, its index sees the blocks a conversation's first turn stored, the index agrees
with the engine's own prefix-cache hit, and the next turn goes to the replica holding them
(x-gateway-balancer says why). About 90 s, most of it the two replicas starting."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.engines import servers
from tests.integration.gateway_harness import GatewayThread

pytestmark = pytest.mark.slow

MODEL = servers.MODEL_NAME
SYSTEM = "You answer questions about the garden tools in our catalogue, briefly and politely. " * 9


@pytest.fixture
def replicas(engine_launcher: Callable[..., Any]) -> list[tuple[Any, int, int]]:
    ports = [(servers.free_port(), servers.free_port()) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(
                engine_launcher,
                "vllm",
                max_model_len=1024,
                max_num_seqs=2,
                cpu_omp_threads_bind=str(i),
                extra_args=["--kv-events-config", servers.kv_events_config(pub, replay)],
            )
            for i, (pub, replay) in enumerate(ports)
        ]
        return [(f.result(), pub, replay) for f, (pub, replay) in zip(futures, ports, strict=True)]


@pytest.fixture
def gateway(replicas: list[tuple[Any, int, int]]) -> Iterator[GatewayThread]:
    backends = [
        {
            "name": f"r{i}",
            "url": server.base_url,
            "model": MODEL,
            "kv_events": {
                "endpoint": f"tcp://127.0.0.1:{pub}",
                "replay_endpoint": f"tcp://127.0.0.1:{replay}",
                "topic": "kv",
            },
        }
        for i, (server, pub, replay) in enumerate(replicas)
    ]
    data = {
        "health": {"interval_s": 2, "scrape_interval_s": 1},
        "pools": {"vllm": {"engine": "vllm", "balancer": "kv_events", "backends": backends}},
        "routes": [{"model": MODEL, "pools": ["vllm"]}],
    }
    gw = GatewayThread(data).start()
    try:
        yield gw
    finally:
        gw.stop()


def chat(gw: GatewayThread, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0}
    r = httpx.post(f"{gw.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def wait_for(check: Callable[[], bool], timeout: float = 10.0, what: Callable[[], object] = str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what()}"
        time.sleep(0.05)


def test_the_next_turn_goes_where_the_engine_cached_the_first(gateway: GatewayThread) -> None:
    fleet = gateway.gateway.kv_events
    assert fleet is not None and set(fleet.subscribers) == {"r0", "r1"}
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which rake for wet leaves?"}]
    first = chat(gateway, turn1)
    holder = first.headers["x-gateway-backend"]
    # Nothing cached anywhere yet: the fallback (a prompt this short has no fingerprint to hash).
    assert first.headers["x-gateway-balancer"].startswith(("kv_events hash ", "kv_events least_load ")), first.headers
    assert "blocks r0:0,r1:0 of 0" in first.headers["x-gateway-balancer"]
    index = fleet.subscribers[holder].index
    sub = fleet.subscribers[holder]
    wait_for(lambda: len(index) >= 3, what=lambda: (len(index), sub.stats, sub.last_seq))  # ~450 tokens: 3 blocks
    assert index.block_size == 128 and len(fleet.subscribers["r1" if holder == "r0" else "r0"].index) == 0

    answer = first.json()["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And for gravel?"}]
    second = chat(gateway, turn2)
    why = second.headers["x-gateway-balancer"]
    assert second.headers["x-gateway-backend"] == holder, why
    assert why.startswith(f"kv_events sticky {holder}; blocks "), why
    matched = dict(part.split(":") for part in why.split("; blocks ")[1].split(" of ")[0].split(","))
    # The index predicted the engine's own prefix-cache hit for this request, to the block.
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert int(matched[holder]) * 128 == cached > 0, (why, cached)
    # ...and the accounting set that prediction against the answer's cached_tokens. The first turn is
    # not compared: no event had told the index the engine's block size yet.
    assert gateway.metric("gateway_kv_events_predicted_cached_tokens_total", backend=holder) == cached
    assert gateway.metric("gateway_kv_events_served_cached_tokens_total", backend=holder) == cached
    assert gateway.metric("gateway_kv_events_predictions_total", backend=holder, verdict="exact") == 1
    assert gateway.metric("gateway_kv_events_batches_total", backend=holder) >= 1
    assert gateway.metric("gateway_kv_events_index_blocks", backend=holder) == len(index)
    assert gateway.metric("gateway_kv_events_lost_total", backend=holder) == 0
