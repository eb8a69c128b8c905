"""The Responses and tokenize protocol adapters, pure: parse, the estimate's view, native or translated
per engine table, the body sent (the client's bytes, or one encoding with the cap's clamp in the
protocol's own field), usage under chat's names, the answer's id, and the engines without an endpoint."""

from __future__ import annotations

import json

import pytest

from gateway.config import LimitsConfig
from gateway.errors import InvalidRequest
from gateway.protocols.edits import NO_EDITS, Edits
from gateway.protocols.native_observers import NativeObserver
from gateway.protocols.responses import RESPONSES
from gateway.protocols.responses_stream import ResponsesStream
from gateway.protocols.sse import StreamObserver
from gateway.protocols.tokenize import DETOKENIZE, TOKENIZE

LIMITS = LimitsConfig()


def parse(body: dict[str, object]) -> object:
    return RESPONSES.parse(json.dumps(body).encode(), LIMITS)


def test_parse_reads_the_fields_the_pipeline_needs() -> None:
    inbound = RESPONSES.parse(
        json.dumps({"model": "m", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 9, "stream": True,
                    "tools": [{"type": "function", "name": "f"}], "api_base": "http://evil"}).encode(),
        LIMITS,
    )  # fmt: skip
    assert (inbound.model, inbound.stream, inbound.max_tokens, inbound.max_tokens_field) == (
        "m", True, 9, "max_output_tokens",
    )  # fmt: skip
    assert inbound.has_tools and inbound.stripped == ("api_base",) and inbound.pin is None
    # The shared-prefix detector and the estimate see instructions + input, chat-shaped.
    view = RESPONSES.estimate_view(inbound)
    assert view is not None and view["messages"][:2] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize(
    "body",
    [{"input": "x"}, {"model": "m"}, {"model": "m", "input": []}, {"model": "m", "input": "x", "stream": "yes"},
     {"model": "m", "input": "x", "max_output_tokens": 0}, {"model": "m", "input": "x", "previous_response_id": 3}],
)  # fmt: skip
def test_bad_input_is_a_400(body: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        parse(body)


def test_previous_response_id_pins_and_is_not_translated() -> None:
    inbound = RESPONSES.parse(b'{"model":"m","input":"more","previous_response_id":"resp_1"}', LIMITS)
    assert inbound.pin == "resp_1" and inbound.translated is None
    assert RESPONSES.target(inbound, "vllm").native
    with pytest.raises(InvalidRequest) as err:
        RESPONSES.target(inbound, "llamacpp")
    assert err.value.code == "previous_response_not_supported"
    assert RESPONSES.estimate_view(inbound) == {"messages": [{"role": "user", "content": "more"}], "tools": None}


@pytest.mark.parametrize(("engine", "native"), [("vllm", True), ("sglang", True), ("llamacpp", False),
                                                ("openai", False), ("sim", False), ("trtllm", False)])  # fmt: skip
def test_native_where_the_engine_table_says_so(engine: str, native: bool) -> None:
    inbound = RESPONSES.parse(b'{"model":"m","input":"hi","stream":true}', LIMITS)
    target = RESPONSES.target(inbound, engine)
    assert target.native is native
    assert target.path == ("/v1/responses" if native else "/v1/chat/completions")
    observer = RESPONSES.observer(inbound, NO_EDITS, target)
    assert isinstance(observer, NativeObserver if native else StreamObserver)
    transform = RESPONSES.stream_transform(inbound, target)
    assert (transform is None) is native and (native or isinstance(transform, ResponsesStream))


def test_encode_sends_the_clients_bytes_or_clamps_the_right_field() -> None:
    raw = b'{"model":"m","input":"hi","max_output_tokens":100}'
    inbound = RESPONSES.parse(raw, LIMITS)
    native, translated = RESPONSES.target(inbound, "vllm"), RESPONSES.target(inbound, "llamacpp")
    assert RESPONSES.encode(inbound, NO_EDITS, None, native) is raw
    clamp = Edits(max_tokens=16)
    assert json.loads(RESPONSES.encode(inbound, clamp, "up", native)) == {
        "model": "up", "input": "hi", "max_output_tokens": 16,
    }  # fmt: skip
    chat = json.loads(RESPONSES.encode(inbound, clamp, None, translated))
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def test_usage_and_answer_id() -> None:
    assert RESPONSES.usage({"usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}}) == {
        "prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
    }  # fmt: skip
    chat_usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert RESPONSES.usage({"usage": chat_usage}) == chat_usage  # a translated answer is chat
    assert RESPONSES.answer_id(b'event: response.created\ndata: {"response":{"id":"resp_ab12"') == "resp_ab12"
    assert RESPONSES.answer_id(b'{"id":"chatcmpl-1"}') is None  # a translated answer stores nothing
    event = RESPONSES.error_event("cut", "upstream_error_midstream")
    assert event.startswith(b"event: error\ndata: ") and json.loads(event.split(b"data: ")[1])["type"] == "error"


def test_tokenize_per_engine() -> None:
    inbound = TOKENIZE.parse(b'{"model":"m","prompt":"hello"}', LIMITS)
    assert TOKENIZE.target(inbound, "vllm").native and TOKENIZE.target(inbound, "sglang").native
    llama = TOKENIZE.target(inbound, "llamacpp")
    assert not llama.native and llama.path == "/tokenize"
    assert json.loads(TOKENIZE.encode(inbound, NO_EDITS, None, llama)) == {"content": "hello", "add_special": True}
    body = json.loads(TOKENIZE.response_body(inbound, b"", {"tokens": [4, 5]}, llama))
    assert body == {"count": 2, "max_model_len": None, "tokens": [4, 5], "token_strs": None}
    for engine in ("openai", "trtllm", "sim"):
        with pytest.raises(InvalidRequest) as err:
            TOKENIZE.target(inbound, engine)
        assert err.value.code == "tokenize_not_supported"
    chat = TOKENIZE.parse(b'{"model":"m","messages":[{"role":"user","content":"x"}]}', LIMITS)
    with pytest.raises(InvalidRequest):
        TOKENIZE.target(chat, "llamacpp")
    with pytest.raises(InvalidRequest):
        TOKENIZE.parse(b'{"model":"m","prompt":"x","messages":[]}', LIMITS)
    assert TOKENIZE.estimate_view(inbound) is None  # nothing to cap or route by


@pytest.mark.parametrize(("answer", "engine"), [({"text": "hi"}, "sglang"), ({"content": "hi"}, "llamacpp")])
def test_detokenize_answers_in_vllms_shape(answer: dict[str, str], engine: str) -> None:
    inbound = DETOKENIZE.parse(b'{"model":"m","tokens":[1,2]}', LIMITS)
    target = DETOKENIZE.target(inbound, engine)
    assert not target.native
    assert json.loads(DETOKENIZE.response_body(inbound, b"", answer, target)) == {"prompt": "hi"}
    raw = b'{"prompt":"hi"}'  # vLLM's own answer passes as it is
    assert DETOKENIZE.response_body(inbound, raw, json.loads(raw), DETOKENIZE.target(inbound, "vllm")) is raw
    with pytest.raises(InvalidRequest):
        DETOKENIZE.parse(b'{"model":"m","tokens":["a"]}', LIMITS)
