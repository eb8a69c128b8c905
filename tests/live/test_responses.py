"""The OpenAI Responses API and /tokenize through the real pipeline (a real uvicorn in front of
simulated engines), read by the official openai SDK: native on vLLM-flavoured backends, translated
on llama.cpp-flavoured ones; previous_response_id, GET and cancel reach the backend that holds the
id; unknown, forgotten and gone ids are OpenAI's 404; caps, metrics and a client leaving."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from gateway.app.build import GatewayApp
from gateway.config_loader import parse_config
from tests.live.conftest import Stack, StackFactory, raw_request, sim_params

pytestmark = pytest.mark.live


def sdk(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="none", max_retries=0)


def gateway_app(stack: Stack) -> GatewayApp:
    app = stack.server.config.loaded_app
    while not isinstance(app, GatewayApp):
        app = app.app  # uvicorn's own middleware wraps the app
    return app


def paths(stack: Stack, name: str) -> list[str]:
    return [r.path for r in stack.sims[name].stats.recent]


# Pools say the engine the simulator imitates: an `engine: sim` pool is translated (a generic engine).
VLLM = {"engine": "vllm"}


@pytest.mark.parametrize(
    ("engine", "flavour", "upstream"),
    [("vllm", "vllm", "/v1/responses"), ("llamacpp", "llamacpp", "/v1/chat/completions"),
     ("sim", "vllm", "/v1/chat/completions")],
)  # fmt: skip
async def test_sdk_create_and_stream(make_stack: StackFactory, engine: str, flavour: str, upstream: str) -> None:
    stack = await make_stack({"p": [sim_params(flavour)]}, pool_p={"engine": engine})
    async with sdk(stack) as client:
        plain = await client.responses.create(
            model="tiny", input="hello", instructions="Be brief.", max_output_tokens=5
        )
        events = [e.type async for e in await client.responses.create(model="tiny", input="hi", stream=True)]
        async with client.responses.stream(model="tiny", input="hi", max_output_tokens=4) as stream:
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    assert plain.output_text and plain.status == "incomplete"  # cut by max_output_tokens
    assert plain.incomplete_details is not None and plain.incomplete_details.reason == "max_output_tokens"
    assert plain.usage is not None and plain.usage.output_tokens == 5
    assert events[:2] == ["response.created", "response.in_progress"] and events[-1] == "response.completed"
    assert "response.output_text.delta" in events
    assert final.output_text == "".join(deltas) and len(deltas) == 4
    # (the request with no max_output_tokens gets the cap's budget, decided by the engine's own count)
    assert [p for p in paths(stack, "p-0") if p not in ("/tokenize", "/apply-template")] == [upstream] * 3
    # Both lenses saw the Responses streams: TTFT per stream, the engine's own output tokens.
    assert stack.total("gateway_time_to_first_token_seconds_count") == 2
    assert stack.total("gateway_output_tokens_total", source="usage") >= 5 + 4


async def test_previous_response_id_reaches_the_backend_that_holds_it(make_stack: StackFactory) -> None:
    stack = await make_stack({"p": [sim_params(), sim_params()]}, pool_p={"balancer": "round_robin", **VLLM})
    async with sdk(stack) as client:
        first = await client.responses.with_raw_response.create(model="tiny", input="remember 7", max_output_tokens=3)
        home = first.headers["x-gateway-backend"]
        rid = first.parse().id
        served = []
        for _ in range(4):
            follow = await client.responses.with_raw_response.create(
                model="tiny", input="what number?", previous_response_id=rid, max_output_tokens=3
            )
            served.append(follow.headers["x-gateway-backend"])
            assert follow.headers["x-gateway-rule"] == "pinned"
            rid = follow.parse().id  # each answer is stored on the same backend
        got = await client.responses.retrieve(rid)
        with pytest.raises(openai.BadRequestError, match="synchronous"):
            await client.responses.cancel(rid)  # the engine's own answer, OpenAI-shaped
    assert served == [home] * 4 and got.id == rid
    other = "p-1" if home == "p-0" else "p-0"
    assert "/v1/responses" not in paths(stack, other)
    assert paths(stack, home)[-2:] == [f"/v1/responses/{rid}", f"/v1/responses/{rid}/cancel"]
    previous = [r.body.get("previous_response_id") for r in stack.sims[home].stats.recent if r.body]
    assert sum(p is not None for p in previous) == 4


async def test_unknown_id_is_openai_404(make_stack: StackFactory) -> None:
    stack = await make_stack(pool_vllm=VLLM)
    async with sdk(stack) as client:
        with pytest.raises(openai.NotFoundError) as posted:
            await client.responses.create(model="tiny", input="x", previous_response_id="resp_nope")
        with pytest.raises(openai.NotFoundError) as fetched:
            await client.responses.retrieve("resp_nope")
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_nope")
    for exc in (posted.value, fetched.value):
        body: Any = exc.body
        assert body["code"] == "response_not_found" and body["type"] == "invalid_request_error"
        assert "resp_nope" in body["message"]
    assert stack.sims["vllm-0"].stats.recent == type(stack.sims["vllm-0"].stats.recent)()  # nothing reached it


async def test_previous_response_id_on_translated_backends_is_a_400(make_stack: StackFactory) -> None:
    stack = await make_stack({"p": [sim_params("llamacpp")]}, pool_p={"engine": "llamacpp"})
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(model="tiny", input="x", previous_response_id="resp_abc")
    body: Any = err.value.body
    assert body["code"] == "previous_response_not_supported" and body["param"] == "previous_response_id"


async def test_store_bound_forgets_the_oldest_id(make_stack: StackFactory) -> None:
    stack = await make_stack(limits={"max_response_ids": 2}, pool_vllm=VLLM)
    async with sdk(stack) as client:
        ids = [(await client.responses.create(model="tiny", input="x", max_output_tokens=2)).id for _ in range(3)]
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(ids[0])  # the backend has it; the gateway forgot where
        assert (await client.responses.retrieve(ids[2])).id == ids[2]
    assert stack.gateway.responses.evicted == 1 and len(stack.gateway.responses) == 2


async def test_backend_gone_is_404(make_stack: StackFactory) -> None:
    stack = await make_stack({"p": [sim_params(), sim_params()]}, pool_p={"balancer": "first_healthy", **VLLM})
    async with sdk(stack) as client:
        rid = (await client.responses.create(model="tiny", input="x", max_output_tokens=2)).id
        assert stack.gateway.responses.get(rid) == "p-0"
        data = stack.gateway.config.model_dump(mode="json", exclude_none=True)
        data["pools"]["p"]["backends"] = data["pools"]["p"]["backends"][1:]  # p-0 leaves the fleet
        await gateway_app(stack).reload(parse_config(data, env={}))
        with pytest.raises(openai.NotFoundError) as fetched:
            await client.responses.retrieve(rid)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="tiny", input="x", previous_response_id=rid)
    body: Any = fetched.value.body
    assert body["code"] == "response_not_found"


async def test_over_cap_is_400_and_max_output_tokens_is_clamped(make_stack: StackFactory) -> None:
    caps = {"max_context_tokens": 200, "max_tokens_limit": 16}
    stack = await make_stack(routes=[{"model": "tiny", "pools": ["vllm"], "caps": caps}], pool_vllm=VLLM)
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(model="tiny", input="word " * 400, instructions="Be brief.")
        ok = await client.responses.with_raw_response.create(model="tiny", input="hi", max_output_tokens=100)
    body: Any = err.value.body
    assert body["code"] == "context_length_exceeded" and "context" in body["message"]
    assert ok.headers["x-gateway-max-tokens-clamped"] == "16"
    sent = stack.sims["vllm-0"].stats.recent[-1].body
    assert sent is not None and sent["max_output_tokens"] == 16
    # The over-long one was counted exactly (the engine's /tokenize), then rejected without leaving.
    assert [r.path for r in stack.sims["vllm-0"].stats.recent] == ["/tokenize", "/v1/responses"]


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp"])
async def test_client_leaving_a_responses_stream_frees_the_engine(make_stack: StackFactory, flavour: str) -> None:
    stack = await make_stack({"p": [sim_params(flavour)]}, pool_p={"engine": flavour})
    body = {"model": "tiny", "input": "go on", "max_output_tokens": 500, "stream": True}
    reader, writer = await raw_request(
        stack.base_url, "/v1/responses", json.dumps(body).encode(), {"x-sim-fault": "chunk_delay=0.02"}
    )
    got = b""
    while got.count(b"response.output_text.delta") < 6:
        chunk = await reader.read(4096)
        assert chunk, "the gateway closed first"
        got += chunk
    writer.close()
    await writer.wait_closed()
    await stack.sims["p-0"].wait_until(lambda s: s.aborted == 1 and s.active == 0, timeout=1.0)
    await stack.wait_metric("gateway_client_disconnects_total", 1, stage="mid_stream")


async def test_tokenize_and_detokenize(make_stack: StackFactory) -> None:
    stack = await make_stack(
        {"v": [sim_params()], "l": [sim_params("llamacpp")], "s": [sim_params()]},
        routes=[
            {"model": "tiny", "pools": ["v"]},
            {"model": "small", "pools": ["l"]},
            {"model": "sim", "pools": ["s"]},
        ],
        pool_v=VLLM,
        pool_l={"engine": "llamacpp"},
    )
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as client:
        native = await client.post("/tokenize", json={"model": "tiny", "prompt": "The gateway routes"})
        translated = await client.post("/tokenize", json={"model": "small", "prompt": "The gateway routes"})
        chat = await client.post("/tokenize", json={"model": "small", "messages": [{"role": "user", "content": "x"}]})
        tokens = native.json()["tokens"]
        back = await client.post("/detokenize", json={"model": "tiny", "tokens": tokens})
        back_l = await client.post("/detokenize", json={"model": "small", "tokens": translated.json()["tokens"]})
        missing = await client.post("/tokenize", json={"model": "tiny"})
        none = await client.post("/tokenize", json={"model": "sim", "prompt": "x"})
    assert native.status_code == translated.status_code == 200
    assert native.json()["count"] == len(tokens) == translated.json()["count"]
    assert translated.json()["tokens"] == tokens  # the same tokenizer, in vLLM's shape either way
    assert back.json() == {"prompt": "The gateway routes"} == back_l.json()
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "invalid_request_error"
    assert none.status_code == 400 and none.json()["error"]["code"] == "tokenize_not_supported"  # engine: sim
    assert stack.sims["l-0"].stats.recent[0].body == {"content": "The gateway routes", "add_special": True}
    await asyncio.sleep(0)


async def test_shared_prefix_rule_sees_instructions_and_input(make_stack: StackFactory) -> None:
    pools = {"vllm": [sim_params()], "sglang": [sim_params("sglang")]}
    routes = [
        {
            "model": "tiny",
            "pools": ["vllm", "sglang"],
            "rules": [
                {"name": "agent", "when": {"shared_prefix": True}, "pool": "sglang"},
                {"name": "default", "pool": "vllm"},
            ],
        }
    ]
    shared = {"routing": {"shared_prefix": {"min_seen": 2, "min_prefix_chars": 256, "block_chars": 64}}}
    stack = await make_stack(pools=pools, routes=routes, pool_vllm=VLLM, pool_sglang={"engine": "sglang"}, **shared)
    agent = "You are a tool-using agent. " * 30
    async with sdk(stack) as client:
        rules = []
        for turn in range(3):
            raw = await client.responses.with_raw_response.create(
                model="tiny", instructions=agent, input=f"step {turn}", max_output_tokens=2
            )
            rules.append((raw.headers["x-gateway-pool"], raw.headers["x-gateway-rule"]))
        one_off = await client.responses.with_raw_response.create(model="tiny", input="a question", max_output_tokens=2)
    assert rules[1:] == [("sglang", "agent")] * 2  # the shared instructions were seen twice
    assert one_off.headers["x-gateway-rule"] == "default"
    assert [r.path for r in stack.sims["sglang-0"].stats.recent] == ["/v1/responses"] * 2  # SGLang serves it natively


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
async def test_a_stream_cut_mid_way_ends_with_an_error_event(make_stack: StackFactory, engine: str) -> None:
    stack = await make_stack({"p": [sim_params(engine)]}, pool_p={"engine": engine})
    body = {"model": "tiny", "input": "go on", "max_output_tokens": 50, "stream": True}
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.post(stack.base_url + "/v1/responses", json=body, headers={"x-sim-fault": "die_after=3"})
    assert r.status_code == 200
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1].startswith("event: error\n")
    assert json.loads(events[-1].split("data: ", 1)[1])["code"] == "upstream_error_midstream"
    names = [e.split("\n", 1)[0].removeprefix("event: ") for e in events]
    assert "response.completed" not in names and names.count("response.output_text.delta") == 3, names
    assert stack.total("gateway_requests_total", outcome="upstream_error_midstream") == 1
