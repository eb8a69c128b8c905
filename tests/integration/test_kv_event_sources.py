"""KV-event subscriptions against REAL engines, beside test_kv_events.py's two-replica routing: a
gateway started after a vLLM engine cached a conversation learns it from the engine's replay socket
when it connects, with no new traffic; a vLLM engine killed and started again on the same ports is
read as a restart (its old view dropped, the new engine's blocks learned); and SGLang, whose CPU
build publishes one-token pages, is matched to the token: the index's prediction equals the
engine's cached_tokens. Each test starts its own engine (~40 s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.pipeline.chat_tokenizer import ChatTokenizer
from tests.engines import servers
from tests.integration.gateway_harness import GatewayThread
from tests.integration.test_kv_events import wait_for

pytestmark = pytest.mark.slow

MODEL = servers.MODEL_NAME
TURN1 = [
    {"role": "system", "content": "You answer questions about the garden tools in our catalogue. " * 20},
    {"role": "user", "content": "Which rake for wet leaves?"},
]


def config(url: str, pub: int, replay: int, engine: str = "vllm") -> dict[str, Any]:
    backend = {
        "name": "r0",
        "url": url,
        "model": MODEL,
        "kv_events": {
            "endpoint": f"tcp://127.0.0.1:{pub}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay}",
            "topic": "kv",
        },
    }
    pool = {
        "engine": engine,
        "balancer": "kv_events",
        "tokenizer": servers.engine_env()["TINY_HF_DIR"],
        "backends": [backend],
    }
    return {
        "health": {"interval_s": 2, "scrape_interval_s": 1},
        "pools": {"p": pool},
        "routes": [{"model": MODEL, "pools": ["p"]}],
    }


def chat(url: str, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{url}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_vllm_a_late_gateway_catches_up_and_a_restarted_engine_is_relearned(
    engine_launcher: Callable[..., Any],
) -> None:
    pub, replay, port = servers.free_port(), servers.free_port(), servers.free_port()
    events = ["--kv-events-config", servers.kv_events_config(pub, replay)]
    engine = engine_launcher("vllm", max_model_len=1024, port=port, extra_args=events)
    chat(engine.v1_url, TURN1)  # cached before any gateway exists
    ids = ChatTokenizer.load(servers.engine_env()["TINY_HF_DIR"]).ids({"messages": TURN1})
    assert ids is not None
    blocks = (len(ids) - 1) // 128  # full blocks short of the last token, which is always computed
    assert blocks >= 3
    gw = GatewayThread(config(engine.base_url, pub, replay)).start()
    try:
        assert gw.gateway.kv_events is not None
        sub = gw.gateway.kv_events.subscribers["r0"]
        # Nothing is sent to the engine meanwhile: only the catch-up at connect can fill the index.
        wait_for(lambda: len(sub.index) >= blocks, what=lambda: (len(sub.index), sub.stats))
        assert sub.stats.replays == 1 and sub.stats.replayed >= 1 and sub.stats.restarts == 0
        # The same conversation through the gateway: matched from the replayed blocks, and served so.
        r = chat(gw.base_url + "/v1", TURN1)
        why = r.headers["x-gateway-balancer"]
        assert why.startswith(f"kv_events sticky r0; blocks r0:{blocks} of {blocks}"), why
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == blocks * 128

        engine.stop()  # killed, and started again on the same ports: an empty cache, seq from 0
        engine = engine_launcher("vllm", max_model_len=1024, port=port, extra_args=events)
        backend = gw.gateway.registry.by_name["r0"]
        wait_for(lambda: backend.healthy, timeout=30, what=lambda: "r0 still unhealthy")
        other = [TURN1[0], {"role": "user", "content": "And which spade for clay?"}]
        chat(gw.base_url + "/v1", other)
        wait_for(lambda: sub.stats.restarts == 1, timeout=30, what=lambda: sub.stats)
        # The old engine's blocks are gone from the view; the new one's are learned.
        wait_for(lambda: len(sub.index) >= 2, what=lambda: (len(sub.index), sub.stats))
        r = chat(gw.base_url + "/v1", TURN1)  # what the new engine holds of it, as its own events say
        why = r.headers["x-gateway-balancer"]
        cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert why.startswith("kv_events sticky r0; blocks r0:"), why
        assert int(why.split("blocks r0:")[1].split(" ")[0]) * 128 == cached > 0, (why, cached)
    finally:
        gw.stop()


def test_sglang_the_index_predicts_the_engines_cached_tokens(engine_launcher: Callable[..., Any]) -> None:
    pub, replay = servers.free_port(), servers.free_port()
    engine = engine_launcher("sglang", extra_args=["--kv-events-config", servers.kv_events_config(pub, replay)])
    gw = GatewayThread(config(engine.base_url, pub, replay, engine="sglang")).start()
    try:
        assert gw.gateway.kv_events is not None
        sub = gw.gateway.kv_events.subscribers["r0"]
        chat(gw.base_url + "/v1", TURN1)
        wait_for(lambda: len(sub.index) > 100, what=lambda: (len(sub.index), sub.stats))
        assert sub.index.block_size == 1  # SGLang's CPU build: one-token pages
        turn2 = [*TURN1, {"role": "assistant", "content": "The leaf rake."}, {"role": "user", "content": "And gravel?"}]
        r = chat(gw.base_url + "/v1", turn2)
        why = r.headers["x-gateway-balancer"]
        cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert why.startswith("kv_events sticky r0;"), why
        assert int(why.split("blocks r0:")[1].split(" ")[0]) == cached > 0, (why, cached)
        assert gw.metric("gateway_kv_events_predictions_total", backend="r0", verdict="exact") >= 1
        assert gw.metric("gateway_kv_events_lost_total", backend="r0") == 0
    finally:
        gw.stop()
