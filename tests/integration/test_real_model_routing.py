"""The SHIPPED gateway.yaml in front of REAL engines that nobody configured for it: a vLLM started with
`--served-model-name` and a llama-server started with no alias (it serves the model file's path). The
only change to the config is each pool's backend URL (a pool with no engine here points at a closed
port). The platform is `no_nvidia_gpu`, what `routing.platform: auto` finds on a host without an
NVIDIA GPU, where the shipped `no-gpu` rule prefers llama.cpp.

The gateway discovers what each engine serves: the official openai client's models.list() shows both
models, models.retrieve() works (an id with slashes too), each model goes to the engine that serves
it, an unknown name is rewritten to llama.cpp's model, the README's own snippet runs unchanged, and a
prompt over vLLM's window is rejected without reaching it (vllm:prompt_tokens_total unchanged).
The SGLang variant does the same with SGLang's /v1/models."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.engines import servers
from tests.integration.gateway_harness import GatewayThread, engine_metric, running_gateway

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "gateway.yaml"


def shipped_config(urls: dict[str, str]) -> dict[str, Any]:
    """gateway.yaml as shipped, with each pool's backend URL pointed at a test engine (or a closed port)."""
    data: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    for name, pool in data["pools"].items():
        pool["backends"][0]["url"] = urls.get(name, f"http://127.0.0.1:{servers.free_port()}")
        assert len(pool["backends"]) == 1, "gateway.yaml's pools changed: update this test"
    return data


def client_for(gw: GatewayThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def routed(client: openai.OpenAI, model: str) -> tuple[str, str, str | None]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    reply = raw.parse()
    assert reply.choices, reply
    return raw.headers["x-gateway-pool"], raw.headers["x-gateway-rule"], raw.headers.get("x-gateway-model")


def over_long(client: openai.OpenAI, model: str, words: int) -> openai.BadRequestError:
    content = f"{uuid.uuid4().hex} " + "word " * words
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], max_tokens=4)
    return err.value


def readme_snippet() -> str:
    """The README's "Use it with your engines" Python snippet, as printed."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    snippets: list[str] = re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)
    (engines,) = [s for s in snippets if "client.models.list()" in s]
    return engines


@pytest.fixture(scope="module")
def vllm_gateway(vllm_server: Any, llamacpp_no_alias: Any) -> Iterator[GatewayThread]:
    urls = {"vllm": vllm_server.base_url, "llamacpp": llamacpp_no_alias.base_url}
    with running_gateway(shipped_config(urls), platform="no_nvidia_gpu") as gw:
        yield gw


def test_models_lists_and_retrieves_what_the_engines_serve(
    vllm_gateway: GatewayThread, vllm_server: Any, llamacpp_no_alias: Any
) -> None:
    gguf = llamacpp_no_alias.model
    assert gguf.endswith(".gguf")  # no alias: llama-server serves its file's path
    client = client_for(vllm_gateway)
    try:
        listed = {m.id: m for m in client.models.list()}
        assert list(listed) == [vllm_server.model, gguf]
        one = client.models.retrieve(vllm_server.model)
        path = client.models.retrieve(gguf)  # an id full of slashes
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no/such-model")
    finally:
        client.close()
    assert (one.owned_by, (one.model_extra or {})["max_model_len"]) == ("vllm", vllm_server.max_context)
    # llama.cpp's per-slot window (-c 2048 --parallel 4), from its /props
    assert (path.owned_by, (path.model_extra or {})["max_model_len"]) == ("llamacpp", 512)
    assert vllm_gateway.metric("gateway_backend_model_info", backend="vllm-0", model=vllm_server.model) == 1024


def test_each_model_goes_to_the_engine_that_serves_it(vllm_gateway: GatewayThread, llamacpp_no_alias: Any) -> None:
    client = client_for(vllm_gateway)
    try:
        # Only vLLM serves "tiny": it goes there although the no-gpu rule prefers llama.cpp.
        assert routed(client, "tiny") == ("vllm", "default", None)
        assert routed(client, llamacpp_no_alias.model) == ("llamacpp", "no-gpu", None)
        # A name nobody serves goes by the rules (no-gpu: llama.cpp) and is sent as its one model.
        assert routed(client, "my-model") == ("llamacpp", "no-gpu", llamacpp_no_alias.model)
    finally:
        client.close()


def test_the_readme_snippet_runs_unchanged(vllm_gateway: GatewayThread) -> None:
    code = readme_snippet().replace("http://127.0.0.1:4000", vllm_gateway.base_url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})  # the README's own code, on purpose
    assert out.getvalue().strip(), "the snippet printed no reply"


def test_a_prompt_over_vllms_window_is_rejected_before_it_is_sent(
    vllm_gateway: GatewayThread, vllm_server: Any
) -> None:
    before = engine_metric(vllm_server.metrics_url, "vllm:prompt_tokens_total")
    client = client_for(vllm_gateway)
    try:
        err = over_long(client, "tiny", 1500)
    finally:
        client.close()
    assert err.code == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in err.message  # vLLM's window, not the 65536 cap
    assert "serving engine's context window" in err.message
    assert engine_metric(vllm_server.metrics_url, "vllm:prompt_tokens_total") == before


def sglang_prompt_tokens(server: Any) -> float:
    return engine_metric(server.metrics_url, "sglang:prompt_tokens_total") + engine_metric(
        server.metrics_url, "sglang_prompt_tokens_total"
    )


def test_sglang_variant(sglang_server: Any, llamacpp_no_alias: Any) -> None:
    urls = {"sglang": sglang_server.base_url, "llamacpp": llamacpp_no_alias.base_url}  # vllm: a closed port
    with running_gateway(shipped_config(urls), platform="no_nvidia_gpu") as gw:
        client = client_for(gw)
        try:
            listed = {m.id: m for m in client.models.list()}
            one = client.models.retrieve(sglang_server.model)
            # Only SGLang serves "tiny". The no-gpu rule's llama.cpp does not; the default rule's vLLM is
            # down (and never said what it serves), so SGLang is its fallback.
            first = routed(client, "tiny")
            other = routed(client, "any-name")
            before = sglang_prompt_tokens(sglang_server)
            err = over_long(client, "tiny", 6000)
            after = sglang_prompt_tokens(sglang_server)
        finally:
            client.close()
    assert list(listed) == [sglang_server.model, llamacpp_no_alias.model]
    # SGLang's /v1/models max_model_len: the served --context-length
    assert (one.owned_by, (one.model_extra or {})["max_model_len"]) == ("sglang", sglang_server.max_context)
    assert first == ("sglang", "fallback:sglang", None)
    assert other == ("llamacpp", "no-gpu", llamacpp_no_alias.model)
    assert err.code == "context_length_exceeded"
    assert f"maximum context length is {sglang_server.max_context} tokens" in err.message
    assert after == before
