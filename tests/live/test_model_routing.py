"""Model discovery and routing by model, live: a real uvicorn gateway in front of SIMULATED engines
(simulators, not real engines; the real ones are in tests/integration/test_real_model_routing.py).
The gateway reads what each simulator serves, routes each name to the engine that serves it, rewrites
a name nobody serves under the wildcard route, lists it all in /v1/models, caps by the engine's
window, and sees an engine restarted with another model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

from engines.sim.server import SimServer
from gateway.config_loader import parse_config
from gateway.serving.server import Running, start
from tests.live.conftest import chat, sim_params

pytestmark = pytest.mark.live

QWEN = "Qwen/Qwen3-0.6B"
GGUF = "/models/tiny.gguf"


def config(urls: dict[str, str], **extra: Any) -> dict[str, Any]:
    """The shipped gateway.yaml's shape: the no-gpu rule prefers llama.cpp, the default is vLLM."""
    return {
        "pools": {
            "vllm": {"engine": "sim", "flavour": "vllm", "backends": [{"url": urls["vllm"]}]},
            "llamacpp": {"engine": "sim", "flavour": "llamacpp", "backends": [{"url": urls["llamacpp"]}]},
        },
        "routes": [
            {
                "model": "*",
                "name": "default",
                "pools": ["vllm", "llamacpp"],
                "rules": [
                    {"name": "no-gpu", "when": {"platform": "no_nvidia_gpu"}, "pool": "llamacpp"},
                    {"name": "default", "pool": "vllm"},
                ],
                "caps": {"max_context_tokens": 65536, "default_max_tokens": 16},
            }
        ],
        "health": {"interval_s": 0.1, "scrape_interval_s": 60},
        **extra,
    }


@asynccontextmanager
async def gateway(data: dict[str, Any], platform: str = "no_nvidia_gpu") -> AsyncIterator[Running]:
    running = await start(parse_config(data, env={}), platform=platform)  # type: ignore[arg-type]
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, SimServer]]:
    sims = {
        "vllm": SimServer(sim_params("vllm", model=QWEN, context_limit=1024)),
        "llamacpp": SimServer(sim_params("llamacpp", model=GGUF, context_limit=512)),
    }
    for sim in sims.values():
        await sim.start()
    yield sims
    for sim in sims.values():
        await sim.stop()


def chats_to(sim: SimServer) -> list[dict[str, Any]]:
    return [r.body for r in sim.stats.recent if r.path == "/v1/chat/completions" and isinstance(r.body, dict)]


async def test_each_model_goes_to_the_engine_that_serves_it(engines: dict[str, SimServer]) -> None:
    urls = {k: s.base_url for k, s in engines.items()}
    async with gateway(config(urls)) as gw, httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
        got = {}
        for name in (QWEN, GGUF, "my-model"):
            r = await client.post("/v1/chat/completions", json=chat(name, max_tokens=2))
            assert r.status_code == 200, r.text
            got[name] = (r.headers["x-gateway-pool"], r.headers["x-gateway-rule"], r.headers.get("x-gateway-model"))
    assert got == {
        QWEN: ("vllm", "default", None),  # only vLLM serves it: the no-gpu rule's pool does not
        GGUF: ("llamacpp", "no-gpu", None),
        "my-model": ("llamacpp", "no-gpu", GGUF),  # nobody serves it: the rules, then the rewrite
    }
    assert [b["model"] for b in chats_to(engines["vllm"])] == [QWEN]
    assert [b["model"] for b in chats_to(engines["llamacpp"])] == [GGUF, GGUF]


async def test_an_alias_is_listed_routed_and_sent_as_its_model(engines: dict[str, SimServer]) -> None:
    urls = {k: s.base_url for k, s in engines.items()}
    async with gateway(config(urls, aliases={"qwen": QWEN})) as gw:
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
            r = await client.post("/v1/chat/completions", json=chat("qwen", max_tokens=2))
            listed = (await client.get("/v1/models")).json()["data"]
        assert (r.status_code, r.headers["x-gateway-pool"], r.headers["x-gateway-model"]) == (200, "vllm", QWEN)
        assert [b["model"] for b in chats_to(engines["vllm"])] == [QWEN]
        by_id = {m["id"]: m for m in listed}
        assert list(by_id) == ["qwen", QWEN, GGUF]  # once each: aliases, then what was discovered
        assert by_id["qwen"]["max_model_len"] == by_id[QWEN]["max_model_len"] == 1024
        assert (by_id[GGUF]["owned_by"], by_id[GGUF]["max_model_len"]) == ("llamacpp", 512)


async def test_models_list_and_retrieve_with_the_openai_client(engines: dict[str, SimServer]) -> None:
    urls = {k: s.base_url for k, s in engines.items()}

    def check(base_url: str) -> None:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="k", max_retries=0, timeout=10)
        assert [m.id for m in client.models.list()] == [QWEN, GGUF]
        one = client.models.retrieve(GGUF)  # an id with slashes
        assert (one.id, one.owned_by, one.model_extra) == (GGUF, "llamacpp", {"max_model_len": 512})
        with pytest.raises(openai.NotFoundError) as err:
            client.models.retrieve("nope/nothing")
        assert err.value.code == "model_not_found"
        client.close()

    async with gateway(config(urls)) as gw:
        await asyncio.to_thread(check, gw.base_url)  # the sync client, off the loop the servers run on


async def test_the_key_allowlist_filters_the_list(engines: dict[str, SimServer]) -> None:
    urls = {k: s.base_url for k, s in engines.items()}
    keys = [{"name": "qwen-only", "key": "sk-q", "models": ["Qwen/*"]}]
    async with gateway(config(urls, keys=keys)) as gw, httpx.AsyncClient(base_url=gw.base_url, timeout=10) as c:
        auth = {"authorization": "Bearer sk-q"}
        assert [m["id"] for m in (await c.get("/v1/models", headers=auth)).json()["data"]] == [QWEN]
        assert (await c.get(f"/v1/models/{QWEN}", headers=auth)).status_code == 200
        assert (await c.get(f"/v1/models{GGUF}", headers=auth)).json()["error"]["code"] == "model_not_found"
        assert (await c.get("/v1/models")).status_code == 401


async def test_a_prompt_over_the_engines_window_is_rejected_before_it_is_sent(engines: dict[str, SimServer]) -> None:
    urls = {k: s.base_url for k, s in engines.items()}
    async with gateway(config(urls)) as gw, httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
        r = await client.post("/v1/chat/completions", json=chat(QWEN, content="word " * 3000))
        ok = await client.post("/v1/chat/completions", json=chat(QWEN))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in r.json()["error"]["message"]  # the window, not 65536
    assert ok.status_code == 200 and chats_to(engines["vllm"])[-1]["max_tokens"] == 16  # only the short one
    assert len(chats_to(engines["vllm"])) == 1


async def wait_until(predicate: Callable[[], Any], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.02)


async def test_an_engine_restarted_with_another_model_is_seen(engines: dict[str, SimServer]) -> None:
    urls = {k: s.base_url for k, s in engines.items()}
    async with gateway(config(urls)) as gw, httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:

        async def listed() -> dict[str, Any]:
            return {m["id"]: m.get("max_model_len") for m in (await client.get("/v1/models")).json()["data"]}

        def info() -> dict[str, float]:
            return {
                s.labels["model"]: s.value
                for f in gw.gateway.metrics.registry.collect()
                for s in f.samples
                if s.name == "gateway_backend_model_info" and s.labels["backend"] == "vllm-0"
            }

        assert await listed() == {QWEN: 1024, GGUF: 512}
        assert info() == {QWEN: 1024.0}
        port = engines["vllm"].port
        await engines["vllm"].stop()
        engines["vllm"] = SimServer(sim_params("vllm", model="other/model", context_limit=2048), port=port)
        await engines["vllm"].start()

        async def seen() -> bool:
            return await listed() == {"other/model": 2048, GGUF: 512}

        await wait_until(seen)
        assert info() == {"other/model": 2048.0}  # the old model's series is gone
        r = await client.post("/v1/chat/completions", json=chat("other/model", max_tokens=2))
        assert (r.status_code, r.headers["x-gateway-pool"]) == (200, "vllm")
        gone = await client.post("/v1/chat/completions", json=chat(QWEN, max_tokens=2))
        assert (gone.headers["x-gateway-pool"], gone.headers["x-gateway-model"]) == ("llamacpp", GGUF)


async def test_a_configured_model_wins_over_discovery(engines: dict[str, SimServer]) -> None:
    data = config({k: s.base_url for k, s in engines.items()})
    data["pools"]["vllm"]["backends"][0] |= {"model": "served-as", "context_window": 300}
    async with gateway(data) as gw, httpx.AsyncClient(base_url=gw.base_url, timeout=10) as client:
        listed = {m["id"]: m.get("max_model_len") for m in (await client.get("/v1/models")).json()["data"]}
        r = await client.post("/v1/chat/completions", json=chat("served-as", content="word " * 400))
    assert listed == {"served-as": 300, GGUF: 512}
    assert r.status_code == 400 and "maximum context length is 300 tokens" in r.json()["error"]["message"]


async def test_plan_uses_the_engines_window(engines: dict[str, SimServer]) -> None:
    from gateway.tools.plan import backend_windows, render_plan

    data = config({k: s.base_url for k, s in engines.items()})
    data["pools"]["llamacpp"]["backends"][0]["context_window"] = 300  # the config's wins, offline too
    for name in ("vllm", "llamacpp"):  # the engines the simulators speak: plan prints their commands
        data["pools"][name]["engine"] = name
    cfg = parse_config(data, env={})
    probed = await asyncio.to_thread(backend_windows, cfg, False)
    assert probed == {"vllm-0": 1024, "llamacpp-0": 300}
    assert backend_windows(cfg, offline=True) == {"llamacpp-0": 300}
    text = render_plan(cfg, windows=probed)
    assert "--max-model-len 1024" in text and "-c 1200" in text  # 300 a slot, 4 slots
    assert text.count("# WARNING: the route's cap (65536) is over this backend's context window") == 2
    assert "--max-model-len 65536" in render_plan(cfg, windows={})
