"""Coding agents through the gateway, for real: the requests Claude Code and Codex CLI put on the wire
(tests/fixtures/agents, recorded by tests/agents/record.py) replayed straight to each real engine and
through the gateway, and the agents themselves (`claude -p`, `codex exec`, the versions pinned in
tests/agents/package.json) finishing their turns through the shipped gateway.yaml.

The engines run with a 64k window, as agents need: llama-server on the agent model (an end-of-turn
token that ends a turn by itself), vLLM and SGLang on the tiny HF model with their long-context
switches, vLLM with its tool-call parser (without one it refuses Claude Code's first request: see
docs/agents.md). Sent straight to an engine a fixture names the engine's model; through the gateway
it keeps the agent's own name (claude-opus-5-5, gpt-5.2-codex), which the `*` route sends as the
engine's, and the answer must carry the agent's name back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from anthropic.types import MessageTokensCount, RawMessageStreamEvent
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.agents.agents import (
    EMPTY_ANSWER_REMINDER,
    TOOL_TEXT,
    AgentRun,
    agents_bin,
    codex_failed,
    run_claude,
    run_codex,
)
from tests.agents.scripted import READY_PATH
from tests.integration.conftest import scoped_engine, servers
from tests.integration.gateway_harness import running_gateway, wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "tests/fixtures/agents").glob("*.json"))
SENT_HEADERS = (
    "anthropic-beta",
    "anthropic-version",
    "user-agent",
    "x-app",
    "x-claude-code-session-id",
    "session-id",
    "thread-id",
    "originator",
)
WINDOW = 65536
MESSAGES_EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
RESPONSES_EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def _fixture(path: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(path.read_text())
    return value


def test_the_fixtures_hold_what_the_agents_really_send() -> None:
    """What made the gateway refuse them before: if a re-recording loses these, the replay below
    no longer tests them, and this says so."""
    names = {p.name.rsplit("-", 1)[0] for p in FIXTURES}
    assert {"claude_first_turn", "claude_tool_result", "claude_count_tokens", "codex_first_turn"} <= names
    claude = _fixture(max(p for p in FIXTURES if p.name.startswith("claude_tool_result")))["request"]
    assert claude["query"] == "beta=true"
    assert "system" in [m["role"] for m in claude["body"]["messages"]]
    assert any(
        b.get("type") == "tool_result" for m in claude["body"]["messages"] for b in m["content"] if isinstance(b, dict)
    )
    assert claude["body"]["thinking"]["type"] == "adaptive"
    codex = _fixture(max(p for p in FIXTURES if p.name.startswith("codex_tool_result")))["request"]["body"]
    kinds = {t["type"] for t in codex["tools"]}
    assert {"function", "namespace", "web_search"} <= kinds
    assert "developer" in [i.get("role") for i in codex["input"]]
    assert any(i.get("type") == "function_call_output" for i in codex["input"])


def send(
    base_url: str, fixture: dict[str, Any], model: str | None = None, max_tokens: int | None = None
) -> httpx.Response:
    request = fixture["request"]
    body = dict(request["body"])
    if model is not None:
        body["model"] = model
    if max_tokens is not None and not request["path"].endswith("count_tokens"):
        body["max_output_tokens" if request["path"].endswith("/responses") else "max_tokens"] = max_tokens
    url = base_url + request["path"] + (f"?{request['query']}" if request["query"] else "")
    headers = {k: v for k, v in request["headers"].items() if k in SENT_HEADERS}
    return httpx.post(url, json=body, headers=headers, timeout=600)


def events(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]


def check_answer(fixture: dict[str, Any], response: httpx.Response, client_model: str | None) -> None:
    """A 2xx answer parses with the official SDK's types; its model is the client's."""
    path = fixture["request"]["path"]
    if path.endswith("/count_tokens"):
        MessageTokensCount.model_validate(response.json())
        return
    stream = fixture["request"]["body"].get("stream") is True
    parsed = events(response.text) if stream else [response.json()]
    assert parsed, response.text[:500]
    if path.endswith("/messages"):
        models = []
        for event in parsed:
            MESSAGES_EVENTS.validate_python(event)
            if event["type"] == "message_start":
                models.append(event["message"]["model"])
        assert parsed[-1]["type"] == "message_stop"
    else:
        models = []
        for event in parsed:
            RESPONSES_EVENTS.validate_python(event)
            if event["type"] in ("response.completed", "response.incomplete"):  # (incomplete: max_output_tokens)
                models.append(event["response"]["model"])
        assert parsed[-1]["type"] in ("response.completed", "response.incomplete"), parsed[-1]
    if client_model is not None:
        assert models == [client_model]


def gateway_config(kind: str, url: str, default_max_tokens: int | None = None) -> dict[str, Any]:
    caps: dict[str, Any] = {"max_context_tokens": WINDOW}
    if default_max_tokens is not None:
        caps["default_max_tokens"] = default_max_tokens
    return {
        "pools": {"agents": {"engine": kind, "backends": [{"url": url}]}},
        "routes": [{"model": "*", "pools": ["agents"], "caps": caps}],
    }


@pytest.fixture(scope="module")
def agent_llamacpp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from scoped_engine(
        request,
        tmp_path_factory,
        "llamacpp",
        "llamacpp-agents.log",
        model_key="TINY_AGENT_GGUF",
        ctx_per_slot=WINDOW,
        parallel=2,
    )


@pytest.fixture(scope="module")
def agent_vllm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tools = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    yield from scoped_engine(
        request, tmp_path_factory, "vllm", "vllm-agents.log", max_model_len=WINDOW, max_num_seqs=2, extra_args=tools
    )


@pytest.fixture(scope="module")
def agent_sglang(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from scoped_engine(
        request, tmp_path_factory, "sglang", "sglang-agents.log", context_length=WINDOW, max_running_requests=2
    )


def differential(server: Any, kind: str, fixture_path: Path, max_tokens: int | None = None) -> None:
    """`max_tokens`: an output limit for both sends, for the engines on the tiny HF model, which never
    ends a turn by itself (the agent's own 32000-128000, or none, would run to the window)."""
    fixture = _fixture(fixture_path)
    direct = send(server.base_url, fixture, model=server.model, max_tokens=max_tokens)
    client_model = fixture["request"]["body"]["model"]
    with running_gateway(gateway_config(kind, server.base_url)) as gw:
        through = send(gw.base_url, fixture, max_tokens=max_tokens)
    # Never stricter than the engine: the same status, or a 2xx where the gateway made the request
    # servable (Claude Code asks for max_tokens 128000; the route's cap clamps it to the window, and
    # vLLM alone refuses it).
    assert through.status_code == direct.status_code or through.is_success, (direct.text[:400], through.text[:400])
    if direct.is_success:  # (an engine's own answer need not parse: llama-server's Responses events do not)
        check_answer(fixture, through, client_model)


# The engines on the tiny HF model never end a turn by themselves: both sends get an output limit.
ENGINES = {"llamacpp": None, "vllm": 16, "sglang": 16}


@pytest.mark.slow
@pytest.mark.parametrize("fixture_path", FIXTURES, ids=lambda p: p.stem)
@pytest.mark.parametrize("engine", list(ENGINES))
def test_every_engine_answers_every_fixture_through_the_gateway_as_it_does_directly(
    request: pytest.FixtureRequest, engine: str, fixture_path: Path
) -> None:
    server = request.getfixturevalue(f"agent_{engine}")
    differential(server, engine, fixture_path, max_tokens=ENGINES[engine])


@pytest.mark.slow
@pytest.mark.parametrize("fixture_path", FIXTURES, ids=lambda p: p.stem)
def test_the_translated_path_answers_every_fixture_and_names_what_it_dropped(
    agent_llamacpp: Any, fixture_path: Path
) -> None:
    """`engine: openai` serves neither Messages nor Responses: the gateway translates to chat."""
    fixture = _fixture(fixture_path)
    with running_gateway(gateway_config("openai", agent_llamacpp.base_url)) as gw:
        through = send(gw.base_url, fixture)
        dropped = gw.metric("gateway_dropped_features_total")
    assert through.status_code == 200, through.text[:500]
    check_answer(
        fixture,
        through,
        None if fixture["request"]["path"].endswith("count_tokens") else fixture["request"]["body"]["model"],
    )
    body = fixture["request"]["body"]
    if fixture["request"]["path"].endswith("/responses"):
        named = through.headers["x-gateway-dropped"].split(",")
        assert "web_search" in named, "a hosted tool is dropped, and said to be"
        assert dropped >= len(named)
    elif body.get("thinking") is not None and not fixture["request"]["path"].endswith("count_tokens"):
        assert "thinking" in through.headers["x-gateway-dropped"].split(",")


# The agents themselves -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_bin() -> Path:
    found = agents_bin()
    if found is None:
        reason = "the coding agents are not installed: bash tests/agents/setup.sh"
        if os.environ.get("GATEWAY_REQUIRE_ENGINES") == "1":
            pytest.fail(f"GATEWAY_REQUIRE_ENGINES=1 and {reason}", pytrace=False)
        pytest.skip(reason)
    return found


def shipped_config(llamacpp_url: str) -> dict[str, Any]:
    """The shipped gateway.yaml, its llama.cpp backend's URL the only change (the test's port)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "gateway.yaml").read_text())
    data["pools"]["llamacpp"]["backends"] = [{"url": llamacpp_url}]
    return data


class Recorder:
    """The recording proxy between the gateway and the engine, with one scripted tool call."""

    def __init__(self, upstream: str, folder: Path, tool_call: str) -> None:
        self.port = servers.free_port()
        self.folder = folder
        argv = [sys.executable, str(ROOT / "tests/agents/scripted.py"), "--upstream", upstream]
        argv += ["--port", str(self.port), "--record", str(folder), "--tool-call", tool_call]
        self.process = subprocess.Popen(argv, start_new_session=True)
        wait_for(lambda: self._ready(), timeout=20)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}{READY_PATH}", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[dict[str, Any]]:
        """The generation requests that reached the engine (not the gateway's health and load probes)."""
        seen = [json.loads(p.read_text()) for p in sorted(self.folder.glob("*.json"))]
        return [r for r in seen if r["method"] == "POST"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def assert_claude_finished(run: AgentRun, turns: int, retries: int = 0) -> None:
    """Claude Code ended with success after `turns` model calls, or up to `retries` more. A call it
    made again because the random-weight model's answer had no text (its transcript says so) is not
    counted, up to one a turn: the model can end a turn at its first token."""
    result = run.claude_result()
    assert run.returncode == 0, run.stderr[-2000:]
    assert result["is_error"] is False and result["subtype"] == "success", result
    empty = run.claude_empty_answer_retries()
    assert empty <= turns, f"{empty} answers with no text in {turns} turns: {result}"
    assert turns <= result["num_turns"] - empty <= turns + retries, (empty, result)


def assert_codex_finished(run: AgentRun) -> list[dict[str, Any]]:
    assert run.returncode == 0, run.stderr[-2000:]
    found = run.codex_events()
    assert not codex_failed(found), found
    assert any(e.get("type") == "turn.completed" for e in found), found
    return found


def _tool_results(requests: list[dict[str, Any]]) -> str:
    return json.dumps([r["body"] for r in requests])


@pytest.mark.slow
def test_claude_code_finishes_its_turns_through_the_shipped_config(
    agent_bin: Path, agent_llamacpp: Any, tmp_path: Path
) -> None:
    with running_gateway(shipped_config(agent_llamacpp.base_url), platform="no_nvidia_gpu") as gw:
        assert_claude_finished(run_claude(agent_bin, gw.base_url, None, "hi", tmp_path / "first"), 1)
        recorder = Recorder(
            agent_llamacpp.base_url,
            tmp_path / "seen",
            'Read:{"file_path": "%s"}' % (tmp_path / "tool" / "work" / "hello.txt"),
        )
        try:
            with running_gateway(shipped_config(recorder.url), platform="no_nvidia_gpu") as tool_gw:
                run = run_claude(
                    agent_bin,
                    tool_gw.base_url,
                    None,
                    "Please use the tool Read on hello.txt",
                    tmp_path / "tool",
                    allowed_tools="Read",
                )
        finally:
            recorder.stop()
    # The random-weight model's answer to the tool's result is at times empty (it ends at once), and
    # Claude Code then asks again, the same conversation with a reminder: a third call, which
    # assert_claude_finished finds in its transcript and the recorder below in what it sent.
    assert_claude_finished(run, 2)
    seen = recorder.requests()
    assert TOOL_TEXT in _tool_results(seen[1:]), "the second request carries the tool's result"
    generations = [r for r in seen if r["path"] == "/v1/messages"]
    for retry in generations[2:]:
        assert EMPTY_ANSWER_REMINDER in json.dumps(retry["body"]["messages"][-1]), (
            "a third turn is the empty answer's retry"
        )
    assert seen[-1]["path"] == "/v1/messages" and seen[-1]["query"] == "beta=true", "native, its query kept"
    assert seen[-1]["body"]["model"] == agent_llamacpp.model


@pytest.mark.slow
def test_codex_finishes_its_turns_through_the_shipped_config(
    agent_bin: Path, agent_llamacpp: Any, tmp_path: Path
) -> None:
    """llama.cpp does not serve Responses as Codex needs it: this is the translated path."""
    recorder = Recorder(agent_llamacpp.base_url, tmp_path / "seen", 'exec_command:{"cmd": "cat hello.txt"}')
    try:
        with running_gateway(shipped_config(recorder.url), platform="no_nvidia_gpu") as gw:
            assert_codex_finished(run_codex(agent_bin, gw.base_url, "gpt-5.2-codex", "hi", tmp_path / "first"))
            found = assert_codex_finished(
                run_codex(
                    agent_bin,
                    gw.base_url,
                    "gpt-5.2-codex",
                    "Please use the tool exec_command to cat hello.txt",
                    tmp_path / "tool",
                )
            )
    finally:
        recorder.stop()
    commands = [
        e["item"] for e in found if e.get("type") == "item.completed" and e["item"].get("type") == "command_execution"
    ]
    assert commands and TOOL_TEXT in commands[0]["aggregated_output"], found
    seen = recorder.requests()
    assert all(r["path"] == "/v1/chat/completions" for r in seen), "translated to chat"
    assert TOOL_TEXT in _tool_results(seen), "a later request carries the tool's result"


@pytest.mark.slow
def test_claude_code_finishes_a_turn_on_the_translated_path(
    agent_bin: Path, agent_llamacpp: Any, tmp_path: Path
) -> None:
    with running_gateway(gateway_config("openai", agent_llamacpp.base_url)) as gw:
        assert_claude_finished(run_claude(agent_bin, gw.base_url, None, "hi", tmp_path), 1)


@pytest.mark.slow
def test_codex_finishes_a_turn_on_vllms_native_responses(agent_bin: Path, agent_vllm: Any, tmp_path: Path) -> None:
    # The tiny HF model never ends a turn by itself: the route's default output budget ends it.
    with running_gateway(gateway_config("vllm", agent_vllm.base_url, default_max_tokens=64)) as gw:
        assert_codex_finished(run_codex(agent_bin, gw.base_url, "gpt-5.2-codex", "hi", tmp_path))
