"""The Messages adapters (gateway/protocols/messages.py): native or translated by the engine table,
the client's bytes when nothing changes, Anthropic's error shape and statuses, usage in chat's names."""

from __future__ import annotations

import json

import pytest

from engines.adapters import ADAPTERS
from gateway.config import LimitsConfig
from gateway.errors import ContextLengthExceeded, InvalidRequest, NoHealthyBackend, Overloaded, RateLimited
from gateway.protocols.anthropic_errors import from_engine_error, from_gateway_error
from gateway.protocols.edits import NO_EDITS, Edits
from gateway.protocols.messages import COUNT_TOKENS, MESSAGES

LIMITS = LimitsConfig()
BODY = {"model": "tiny", "max_tokens": 8, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
RAW = json.dumps(BODY).encode()


def test_the_engine_tables_say_who_serves_messages_natively() -> None:
    native = {kind for kind, a in ADAPTERS.items() if "messages" in a.native_apis}
    assert native == {"vllm", "sglang", "llamacpp", "sim"}
    assert {kind for kind, a in ADAPTERS.items() if "count_tokens" in a.native_apis} == native
    inbound = MESSAGES.parse(RAW, LIMITS)
    for kind in ADAPTERS:
        target = MESSAGES.target(inbound, kind)
        assert target.native == (kind in native)
        assert target.path == ("/v1/messages" if kind in native else "/v1/chat/completions")


def test_native_sends_the_clients_bytes_translated_sends_chat() -> None:
    inbound = MESSAGES.parse(RAW, LIMITS)
    native, chat = MESSAGES.target(inbound, "vllm"), MESSAGES.target(inbound, "openai")
    assert MESSAGES.encode(inbound, NO_EDITS, None, native) is RAW
    clamped = json.loads(MESSAGES.encode(inbound, Edits(max_tokens=3), "up", native))
    assert clamped == {**BODY, "max_tokens": 3, "model": "up"}
    sent = json.loads(MESSAGES.encode(inbound, Edits(max_tokens=3), "up", chat))
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert (sent["max_tokens"], sent["model"]) == (3, "up")
    view = MESSAGES.estimate_view(inbound)
    assert view is not None and view["messages"][0]["content"] == "be brief"  # the prefix detector sees system


@pytest.mark.parametrize(
    "body",
    [
        {k: v for k, v in BODY.items() if k != "max_tokens"},
        {**BODY, "max_tokens": 0},
        {**BODY, "stream": "yes"},
        {**BODY, "messages": []},
        {**BODY, "model": 3},
    ],
)
def test_bad_requests_are_400(body: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        MESSAGES.parse(json.dumps(body).encode(), LIMITS)


def test_errors_have_anthropics_shape_and_status() -> None:
    cases = [
        (Overloaded("busy", retry_after=1), 529, "overloaded_error"),
        (RateLimited("slow down", limit="requests", retry_after=3), 429, "rate_limit_error"),
        (ContextLengthExceeded("too long", param="messages"), 400, "invalid_request_error"),
        (NoHealthyBackend("none"), 503, "api_error"),
    ]
    for err, status, kind in cases:
        assert MESSAGES.error_status(err) == status
        body = json.loads(MESSAGES.error_body(err))
        assert body == {"type": "error", "error": {"type": kind, "message": err.message}}
    event = MESSAGES.error_event("cut", "upstream_error_midstream")
    assert event.startswith(b"event: error\ndata: ") and json.loads(event.split(b"data: ")[1])["type"] == "error"


def test_usage_in_chats_names() -> None:
    native = {"type": "message", "usage": {"input_tokens": 3, "cache_read_input_tokens": 4, "output_tokens": 5}}
    assert MESSAGES.usage(native) == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    chat = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    assert MESSAGES.usage(chat) == chat["usage"]


def test_count_tokens_translated_reads_the_engines_prompt_count() -> None:
    raw = json.dumps({k: v for k, v in BODY.items() if k != "max_tokens"}).encode()
    inbound = COUNT_TOKENS.parse(raw, LIMITS)
    assert COUNT_TOKENS.estimate_view(inbound) is None  # never capped
    target = COUNT_TOKENS.target(inbound, "openai")
    sent = json.loads(COUNT_TOKENS.encode(inbound, NO_EDITS, None, target))
    assert (sent["max_tokens"], sent["stream"], target.path) == (1, False, "/v1/chat/completions")
    answer = {"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 1}}
    assert json.loads(COUNT_TOKENS.response_body(inbound, b"", answer, target)) == {"input_tokens": 17}
    assert COUNT_TOKENS.usage(answer) is None
    native = COUNT_TOKENS.target(inbound, "llamacpp")
    assert native.path == "/v1/messages/count_tokens" and COUNT_TOKENS.encode(inbound, NO_EDITS, None, native) is raw


def test_reasoning_content_off_survives_yaml() -> None:
    import yaml

    from gateway.config_loader import parse_config

    data = yaml.safe_load("pools: {p: {engine: vllm, backends: [{url: 'http://x'}]}}\nroutes:\n"
                          "  - {model: a, pools: [p], reasoning_content: off}\n"
                          "  - {model: b, pools: [p], reasoning_content: copy}\n")  # fmt: skip
    config = parse_config(data, env={})
    assert [r.reasoning_content for r in config.routes] == ["off", "copy"]


def test_an_engines_own_length_field_is_capped_too() -> None:
    raw = json.dumps({**BODY, "n_predict": 5000}).encode()
    inbound = MESSAGES.parse(raw, LIMITS)
    assert inbound.max_tokens == 5000  # the cap sees the largest
    sent = json.loads(MESSAGES.encode(inbound, Edits(max_tokens=4), None, MESSAGES.target(inbound, "llamacpp")))
    assert (sent["max_tokens"], sent["n_predict"]) == (4, 4)


@pytest.mark.parametrize(
    ("message", "head"),
    [
        (
            "This model's maximum context length is 1024 tokens. However, you requested 1300 tokens "
            "(1200 in the messages, 100 in the completion).",
            "prompt is too long: 1200 tokens > 1024 maximum",
        ),
        (
            "This model's maximum context length is 1024 tokens. However, you requested 1100 tokens "
            "(1000 in the messages, 100 in the completion).",
            "input length and `max_tokens` exceed context limit: 1000 + 100 > 1024",
        ),
        (
            "This model's maximum context length is 1024 tokens. However, your messages resulted in 2000 tokens.",
            "prompt is too long: 2000 tokens > 1024 maximum",
        ),
    ],
)
def test_context_errors_use_anthropics_words_and_keep_the_counts(message: str, head: str) -> None:
    """Anthropic clients recognise an over-long prompt by Anthropic's own phrases ("prompt is too
    long: N tokens > M maximum"); the OpenAI-worded counts follow, for clients that read those."""
    status, body = from_gateway_error(ContextLengthExceeded(message, param="messages"))
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(head)
    assert body["error"]["message"].endswith(message)
    engine = from_engine_error(400, json.dumps({"error": {"message": message}}).encode())
    assert engine["error"]["message"].startswith(head)


def test_a_context_error_without_counts_is_left_as_it_is() -> None:
    status, body = from_gateway_error(ContextLengthExceeded("Too long for this route.", param="messages"))
    assert (status, body["error"]["message"]) == (400, "Too long for this route.")
