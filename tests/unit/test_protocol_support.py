"""The protocol adapters' small pure parts: Anthropic-shaped errors, the response-id store, the
reasoning-field copy and the SSE data framer."""

from __future__ import annotations

import json

import pytest
from protocol_fixtures import ENGINES, feed_in_pieces, load, stream_bytes

from gateway import errors
from gateway.protocols.anthropic_errors import error_body, error_type, from_engine_error, from_gateway_error
from gateway.protocols.frames import DataFrames, decode_event, encode_event, is_done
from gateway.protocols.reasoning import ReasoningStream, copy_reasoning, copy_reasoning_bytes
from gateway.protocols.response_store import ResponseStore, find_response_id, not_found_body

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (415, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "api_error"),
        (504, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_anthropic_error_types_by_status(status: int, kind: str) -> None:
    assert error_type(status) == kind
    assert error_body(status, "m") == {"type": "error", "error": {"type": kind, "message": "m"}}


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (errors.InvalidRequest("bad"), 400, "invalid_request_error"),
        (errors.ContextLengthExceeded("long"), 400, "invalid_request_error"),
        (errors.Unauthorized("key"), 401, "authentication_error"),
        (errors.ModelNotFound("model"), 404, "not_found_error"),
        (errors.PayloadTooLarge("big"), 413, "request_too_large"),
        (errors.Overloaded("busy", retry_after=2), 529, "overloaded_error"),
        (errors.Overloaded("busy", status=503), 529, "overloaded_error"),
        (errors.NoHealthyBackend("none"), 503, "api_error"),
        (errors.UpstreamError("conn"), 502, "api_error"),
        (errors.UpstreamTimeout("slow"), 504, "api_error"),
        (errors.EngineError("e", status=429, type_="x", code=None), 429, "rate_limit_error"),
    ],
)
def test_gateway_errors_in_anthropic_shape(exc: errors.GatewayError, status: int, kind: str) -> None:
    assert from_gateway_error(exc) == (status, {"type": "error", "error": {"type": kind, "message": exc.message}})


# Every recorded engine error on /v1/messages (llama.cpp answers an unknown model and a missing
# max_tokens with 200, so those two are vLLM's only).
ENGINE_ERRORS = [
    (engine, name)
    for engine in ENGINES
    for name in ("error_messages_too_long", "error_messages_unknown_model", "error_messages_missing_max_tokens")
    if load(engine, name)["status"] >= 400
]


@pytest.mark.parametrize(("engine", "name"), ENGINE_ERRORS)
def test_engine_errors_are_normalised_keeping_their_message(engine: str, name: str) -> None:
    record = load(engine, name)
    raw = json.dumps(record["body"]).encode()
    body = from_engine_error(record["status"], raw)
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == error_type(record["status"])
    inner = record["body"]["error"]
    assert body["error"]["message"] == inner["message"]


def test_engine_errors_of_any_shape_get_a_message() -> None:
    assert from_engine_error(404, b'{"detail":"Not Found"}')["error"] == {
        "type": "not_found_error",
        "message": "Not Found",
    }
    assert from_engine_error(502, b"<html>")["error"]["message"] == "The backend answered with status 502."
    flat = b'{"object":"error","message":"too long","type":"BadRequestError","code":400}'  # SGLang's
    assert from_engine_error(400, flat)["error"] == {"type": "invalid_request_error", "message": "too long"}


def test_the_store_forgets_the_least_recently_used_id_past_its_bound() -> None:
    store = ResponseStore(max_ids=3)
    for i in range(3):
        store.put(f"resp_{i}", f"b{i}")
    assert store.get("resp_0") == "b0"  # now the most recently used
    store.put("resp_3", "b3")
    assert (store.get("resp_1"), store.get("resp_0"), store.get("resp_3"), len(store), store.evicted) == (
        None,
        "b0",
        "b3",
        3,
        1,
    )
    store.put("resp_0", "b9")
    assert store.get("resp_0") == "b9" and len(store) == 3


def test_the_store_drops_a_departed_backends_ids() -> None:
    store = ResponseStore()
    store.put("a", "x")
    store.put("b", "y")
    store.put("c", "x")
    assert store.forget_backend("x") == 2
    assert (store.get("a"), store.get("b"), store.get("c")) == (None, "y", None)
    with pytest.raises(ValueError):
        ResponseStore(max_ids=0)


def test_an_unknown_response_is_an_openai_shaped_404() -> None:
    vllm = load("vllm", "stored_error_previous_unknown")["body"]["error"]
    ours = not_found_body("resp_nope")["error"]
    assert set(ours) == set(vllm) and ours["message"] == vllm["message"] and ours["type"] == vllm["type"]
    assert ours["code"] == "response_not_found"


def test_reasoning_is_copied_to_reasoning_content_only_where_missing() -> None:
    body = {
        "choices": [
            {"message": {"content": "a", "reasoning": "r"}},
            {"delta": {"reasoning": "s", "reasoning_content": "t"}},
        ]
    }
    assert copy_reasoning(body)
    assert body["choices"][0]["message"]["reasoning_content"] == "r"
    assert body["choices"][1]["delta"]["reasoning_content"] == "t"
    assert not copy_reasoning({"choices": [{"message": {"content": "a"}}]})
    plain = b'{"choices":[{"message":{"content":"a"}}]}'
    assert copy_reasoning_bytes(plain) is plain
    copied = json.loads(copy_reasoning_bytes(b'{"choices":[{"message":{"reasoning":"r"}}]}'))
    assert copied["choices"][0]["message"] == {"reasoning": "r", "reasoning_content": "r"}


@pytest.mark.parametrize("seed", range(3))
def test_the_reasoning_stream_rewrites_only_reasoning_events(seed: int) -> None:
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {"reasoning": "hm"}, "finish_reason": None}]}
    reasoning = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    recorded = stream_bytes("vllm", "chat_for_messages_stream")
    stream = ReasoningStream()
    out = feed_in_pieces(stream.feed, reasoning + recorded, seed) + stream.flush()
    head, _, rest = out.partition(b"\n\n")
    assert json.loads(head[6:])["choices"][0]["delta"] == {"reasoning": "hm", "reasoning_content": "hm"}
    assert rest == recorded.replace(b"\r\n", b"\n")


def test_frames_join_multiline_data_skip_comments_and_flush_the_tail() -> None:
    frames = DataFrames()
    assert frames.feed(b": ping\n\nevent: x\ndata: a\ndata: b\n\ndata:c\r\n\r\ndata: [DO") == [b"a\nb", b"c"]
    assert frames.flush() == [b"[DO"]
    assert is_done(b" [DONE]") and not is_done(b'{"a":1}')
    assert decode_event(b"[1]") is None and decode_event(b"nope") is None and decode_event(b'{"a":1}') == {"a": 1}
    assert encode_event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'


@pytest.mark.parametrize(("engine", "name"), [("vllm", "responses"), ("llamacpp", "responses"), ("vllm", "stored_get")])
def test_the_response_id_is_found_in_a_native_body(engine: str, name: str) -> None:
    body = load(engine, name)["body"]
    assert find_response_id(json.dumps(body, separators=(",", ":")).encode()) == body["id"]
    assert find_response_id(json.dumps(body, indent=2).encode()) == body["id"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_response_id_is_found_in_a_native_streams_first_event(engine: str) -> None:
    data = stream_bytes(engine, "responses_stream")
    first = data[: data.index(b"\n\n")]
    completed = json.loads(data.rstrip().rsplit(b"\n", 1)[-1][6:])
    assert find_response_id(first) == completed["response"]["id"]
    assert find_response_id(b'{"id":"msg_1"}') is None
