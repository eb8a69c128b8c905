"""Each flavour's shapes over real sockets: completions (whole and streamed), usage, finish reasons,
context errors, tokenize, health, models, metrics names, embeddings, and the /sim control endpoints."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable

import httpx
import pytest
from sim_helpers import CHAT_PATH, SimFactory, chat_body, content_of, metric, metric_names, sse_json

from engines.sim import SimServer
from engines.sim_text import filler_text

pytestmark = pytest.mark.live

FLAVOURS = ["vllm", "sglang", "llamacpp"]
JSON_TYPE = {"vllm": "application/json", "sglang": "application/json", "llamacpp": "application/json; charset=utf-8"}
# vLLM 0.32's prompt_tokens_details in a chat completion's usage, besides cached_tokens.
VLLM_DETAILS = {"vllm": {"created_cache_tokens": 0, "multimodal_tokens": None}}
Client = Callable[[SimServer], httpx.AsyncClient]


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_chat_completion_whole(make_sim: SimFactory, client: Client, flavour: str) -> None:
    sim = await make_sim(flavour)
    r = await client(sim).post(CHAT_PATH, json=chat_body("hello there", max_tokens=4))
    assert r.status_code == 200 and r.headers["content-type"] == JSON_TYPE[flavour]
    body = r.json()
    assert {"id", "object", "created", "model", "choices", "usage"} <= body.keys()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["message"] == choice["message"] | {"role": "assistant", "content": filler_text(4)}
    usage = body["usage"]
    assert usage["completion_tokens"] == 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + 4
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0} | VLLM_DETAILS.get(flavour, {})
    assert ("timings" in body) == (flavour == "llamacpp")


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_completion_whole(make_sim: SimFactory, client: Client, flavour: str) -> None:
    sim = await make_sim(flavour)
    r = await client(sim).post("/v1/completions", json={"model": "tiny", "prompt": "abcdefgh", "max_tokens": 3})
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == filler_text(3)
    assert body["usage"]["prompt_tokens"] == 2  # 8 bytes


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("include_usage", [True, False])
async def test_chat_stream(make_sim: SimFactory, client: Client, flavour: str, include_usage: bool) -> None:
    sim = await make_sim(flavour)
    body = chat_body(max_tokens=3, stream=True, stream_options={"include_usage": include_usage})
    r = await client(sim).post(CHAT_PATH, json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["transfer-encoding"] == "chunked"
    events = sse_json(r.content)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert content_of(events) == filler_text(3)
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    content_events = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(content_events) == 3  # one token per event
    if flavour == "vllm":  # vLLM puts the finish reason on the last content chunk
        assert content_events[-1]["choices"][0]["finish_reason"] == "length"
    usage_events = [e for e in events if e.get("usage")]
    if include_usage:
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
        created = {"created_cache_tokens": 0} if flavour == "vllm" else {}  # a stream leaves nulls out
        assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} | created
        assert usage_events == [events[-1]]
    else:
        assert usage_events == []


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_completion_stream_usage(make_sim: SimFactory, client: Client, flavour: str) -> None:
    sim = await make_sim(flavour)
    r = await client(sim).post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True})
    events = sse_json(r.content)
    assert content_of(events) == filler_text(2)
    assert all(e["object"] == "text_completion" for e in events)
    # llama.cpp always puts usage on the final chunk of a completions stream; the others need the option.
    assert ("usage" in events[-1] and events[-1]["usage"] is not None) == (flavour == "llamacpp")
    if flavour == "llamacpp":
        assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_too_long_vllm(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("vllm", context_limit=100)
    for stream in (False, True):
        r = await client(sim).post(CHAT_PATH, json=chat_body("x" * 800, stream=stream))
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert err.keys() == {"message", "type", "param", "code"}
        assert (err["type"], err["param"], err["code"]) == ("BadRequestError", "input_tokens", 400)
        assert "maximum context length is 100 tokens" in err["message"]
        assert "at least 101 input tokens" in err["message"]  # vLLM stops counting one past the limit


async def test_vllm_clamps_output_that_does_not_fit(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("vllm", context_limit=20)
    r = await client(sim).post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 20})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 10
    assert r.json()["choices"][0]["finish_reason"] == "length"
    # max_tokens alone above max_model_len is a 400, however short the prompt.
    r = await client(sim).post("/v1/completions", json={"prompt": "x", "max_tokens": 21})
    assert r.status_code == 400
    assert r.json()["error"] | {"message": ""} == {"message": "", "type": "BadRequestError", "param": "max_tokens",
                                                   "code": 400}  # fmt: skip


async def test_too_long_sglang(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("sglang", context_limit=100)
    r = await client(sim).post(CHAT_PATH, json=chat_body("x" * 800, stream=True))
    assert r.status_code == 400
    assert r.json() == r.json() | {"object": "error", "type": "BadRequestError", "param": None, "code": 400}
    assert "longer than the model's context length (100 tokens)" in r.json()["message"]
    r = await client(sim).post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 95})
    assert r.status_code == 400 and "You requested a total of 105 tokens" in r.json()["message"]


async def test_too_long_llamacpp(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("llamacpp", context_limit=100)
    r = await client(sim).post("/v1/completions", json={"prompt": "x" * 800, "stream": True})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "code": 400,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 200,
            "n_ctx": 100,
            "message": "request (200 tokens) exceeds the available context size (100 tokens), try increasing it",
        }
    }
    r = await client(sim).post("/v1/completions", json={"prompt": "x" * 40, "max_tokens": 10**6})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 90  # silently clamped


@pytest.mark.parametrize(
    ("flavour", "shape"),
    [("vllm", {"error"}), ("sglang", {"object", "message", "type", "param", "code"}), ("llamacpp", {"error"})],
)
async def test_bad_requests(make_sim: SimFactory, client: Client, flavour: str, shape: set[str]) -> None:
    sim = await make_sim(flavour)
    c = client(sim)
    bad = [
        await c.post(CHAT_PATH, content=b'{"model": "tiny", "messages": [', headers={"content-type": "json"}),
        await c.post(CHAT_PATH, json=chat_body(n=2)),
        await c.post(CHAT_PATH, json=chat_body(max_tokens=0)),
        await c.post(CHAT_PATH, json={"model": "tiny"}),
        await c.post(CHAT_PATH, json=[1]),
        await c.post("/v1/completions", json={"prompt": ["a", "b"]}),
    ]
    # llama-server (this build) answers malformed JSON with a 500 naming nlohmann's parse error.
    assert bad[0].status_code == (500 if flavour == "llamacpp" else 400), bad[0].text
    assert ("json.exception.parse_error" in bad[0].text) == (flavour == "llamacpp")
    for r in bad[1:]:
        assert r.status_code == 400, r.text
    for r in bad:
        assert r.json().keys() == shape
    assert sim.stats.running == sim.stats.waiting == 0


async def test_unknown_model_per_flavour(make_sim: SimFactory, client: Client) -> None:
    vllm = await make_sim("vllm")
    r = await client(vllm).post(CHAT_PATH, json=chat_body(model="nope"))
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    sglang = await make_sim("sglang")
    r = await client(sglang).post(CHAT_PATH, json=chat_body(model="nope"))
    assert r.status_code == 200 and r.json()["model"] == "nope"  # SGLang does not check


@pytest.mark.parametrize(("flavour", "health"), [("vllm", b""), ("sglang", b""), ("llamacpp", b'{"status":"ok"}')])
async def test_health_models_and_unknown_paths(
    make_sim: SimFactory, client: Client, flavour: str, health: bytes
) -> None:
    sim = await make_sim(flavour, context_limit=777)
    c = client(sim)
    r = await c.get("/health")
    assert (r.status_code, r.content) == (200, health)
    models = (await c.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    if flavour != "llamacpp":
        assert models["data"][0]["max_model_len"] == 777
    missing = await c.get("/v1/nothing")
    assert missing.status_code == 404
    llamacpp_404 = {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
    assert missing.json() == (llamacpp_404 if flavour == "llamacpp" else {"detail": "Not Found"})
    assert (await c.get(CHAT_PATH)).status_code == 405
    assert sim.stats.seen == 2  # probes are not counted; the 404 and the 405 are


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
async def test_tokenize_vllm_style(make_sim: SimFactory, client: Client, flavour: str) -> None:
    sim = await make_sim(flavour, context_limit=999)
    c = client(sim)
    r = (await c.post("/tokenize", json={"model": "tiny", "prompt": "abcdefghi"})).json()
    assert r.keys() == {"count", "max_model_len", "tokens"} | ({"token_strs"} if flavour == "vllm" else set())
    assert (r["count"], len(r["tokens"]), r["max_model_len"]) == (3, 3, 999)
    msgs = chat_body("some words here")["messages"]
    t = (await c.post("/tokenize", json={"model": "tiny", "messages": msgs, "add_generation_prompt": True})).json()
    chat = (await c.post(CHAT_PATH, json=chat_body("some words here", max_tokens=1))).json()
    assert t["count"] == chat["usage"]["prompt_tokens"]
    assert (await c.post("/tokenize", json={"model": "tiny"})).status_code == 400


async def test_tokenize_and_template_llamacpp(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("llamacpp")
    c = client(sim)
    assert (await c.post("/tokenize", json={"content": "abcdefghi"})).json().keys() == {"tokens"}
    msgs = chat_body("some words here")["messages"]
    prompt = (await c.post("/apply-template", json={"messages": msgs})).json()["prompt"]
    assert prompt.startswith("<|im_start|>user\nsome words here<|im_end|>")
    tokens = (await c.post("/tokenize", json={"content": prompt})).json()["tokens"]
    chat = (await c.post(CHAT_PATH, json=chat_body("some words here", max_tokens=1))).json()
    assert len(tokens) == chat["usage"]["prompt_tokens"]
    assert (await c.post("/tokenize", json={"prompt": "x"})).status_code == 400


REQUIRED_METRICS = {
    "vllm": {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
             "vllm:generation_tokens_total", "vllm:request_success_total"},
    "sglang": {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
               "sglang:cached_tokens_total", "sglang:prompt_tokens_total"},
    "llamacpp": {"llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:prompt_tokens_total",
                 "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_cached_total"},
}  # fmt: skip
GENERATED = {"vllm": "vllm:generation_tokens_total", "sglang": "sglang:generation_tokens_total",
             "llamacpp": "llamacpp:tokens_predicted_total"}  # fmt: skip


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_metrics_names_and_counts(make_sim: SimFactory, client: Client, flavour: str) -> None:
    sim = await make_sim(flavour)
    c = client(sim)
    r = await c.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert REQUIRED_METRICS[flavour] <= metric_names(r.text)
    assert all(n.startswith(f"{flavour}:") for n in metric_names(r.text))
    await c.post(CHAT_PATH, json=chat_body(max_tokens=5))
    after = (await c.get("/metrics")).text
    assert metric(after, GENERATED[flavour]) == 5
    if flavour == "vllm":
        assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 1' in after


async def test_embeddings(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("vllm")
    r = (await client(sim).post("/v1/embeddings", json={"model": "tiny", "input": ["a", "bb"]})).json()
    assert r["object"] == "list" and [d["index"] for d in r["data"]] == [0, 1]
    assert len(r["data"][0]["embedding"]) == 8 and r["data"][0]["embedding"] != r["data"][1]["embedding"]
    assert r["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    ids = (await client(sim).post("/v1/embeddings", json={"input": [[1, 2, 3], [4]]})).json()
    assert len(ids["data"]) == 2 and ids["usage"]["prompt_tokens"] == 4
    for bad in ({"model": "tiny"}, {"input": 5}, {"input": [{"a": 1}]}, {"input": []}):
        assert (await client(sim).post("/v1/embeddings", json=bad)).status_code == 400


async def test_embeddings_as_base64(make_sim: SimFactory, client: Client) -> None:
    """As vLLM and OpenAI: `encoding_format: "base64"` is the float32 bytes, little-endian, in base64
    (what the openai SDKs ask for by default and decode); "float" is the default."""
    sim = await make_sim("vllm")
    body = {"model": "tiny", "input": ["a", "bb"]}
    floats = (await client(sim).post("/v1/embeddings", json=body)).json()["data"]
    packed = (await client(sim).post("/v1/embeddings", json={**body, "encoding_format": "base64"})).json()["data"]
    for f, p in zip(floats, packed, strict=True):
        assert isinstance(p["embedding"], str)
        raw = base64.b64decode(p["embedding"])
        assert len(raw) == 4 * 8
        decoded = struct.unpack("<8f", raw)
        assert decoded == pytest.approx(f["embedding"], abs=1e-6)
    explicit = {**body, "encoding_format": "float"}
    assert (await client(sim).post("/v1/embeddings", json=explicit)).json()["data"] == floats
    assert (await client(sim).post("/v1/embeddings", json={**body, "encoding_format": "hex"})).status_code == 400


async def test_slots_llamacpp(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("llamacpp", max_batch=3, base_step_s=0.05)
    c = client(sim)
    slots = (await c.get("/slots")).json()
    assert [s["id"] for s in slots] == [0, 1, 2] and not any(s["is_processing"] for s in slots)
    async with c.stream("POST", CHAT_PATH, json=chat_body(max_tokens=50, stream=True)) as r:
        async for _ in r.aiter_lines():
            break
        slots = (await c.get("/slots")).json()
        assert [s["is_processing"] for s in slots] == [True, False, False]


async def test_control_endpoints_record_what_reached_the_backend(make_sim: SimFactory, client: Client) -> None:
    sim = await make_sim("vllm")
    c = client(sim)
    await c.post(CHAT_PATH, json=chat_body(max_tokens=1), headers={"authorization": "Bearer upstream-key"})
    await c.get("/health")
    records = (await c.get("/sim/requests")).json()
    assert len(records) == 1
    rec = records[0]
    assert (rec["method"], rec["path"], rec["outcome"]) == ("POST", CHAT_PATH, "completed")
    assert rec["headers"]["authorization"] == "Bearer upstream-key"
    assert rec["body"]["max_tokens"] == 1
    stats = (await c.get("/sim/stats")).json()
    assert stats == {"seen": 1, "active": 0, "aborted": 0, "completed": 1, "killed": 0, "waiting": 0, "running": 0}
    assert (await c.post("/sim/reset", content=b"{")).status_code == 400
    assert (await c.post("/sim/reset")).json()["seen"] == 0
    assert (await c.get("/sim/requests")).json() == []
    assert json.loads((await c.get("/sim/stats")).content)["completed"] == 0
