"""Bad input gets a 400 with the field named, never an exception escaping as a 500."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from gateway.errors import InvalidRequest
from gateway.protocols.chat import CHAT
from gateway.protocols.inbound import parse_request

pytestmark = pytest.mark.unit


def parse(body: object, kind: str = "chat", raw: bytes | None = None):  # type: ignore[no-untyped-def]
    data = raw if raw is not None else json.dumps(body).encode()
    return parse_request(kind, data, max_depth=64, max_n=8, max_messages=100)  # type: ignore[arg-type]


OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_valid_chat() -> None:
    req = parse({**OK, "stream": True, "max_tokens": 5, "stream_options": {"include_usage": True}})
    assert (req.model, req.stream, req.max_tokens, req.include_usage, req.stripped) == ("m", True, 5, True, ())
    # Nothing to change: the client's own bytes go upstream.
    assert CHAT.encode(req, CHAT.base_edits(req), None, CHAT.target(req, "vllm")) is req.raw


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "invalid_json"),
        (b"{not json", "invalid_json"),
        (b"[]", "invalid_json"),
        (b'"x"', "invalid_json"),
        (b"null", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}', "invalid_json"),
        (b'{"model":"m","x":NaN}', "invalid_json"),
        (b'{"model":"m","x":' + b"[" * 10_000 + b"]" * 10_000 + b"}", "json_too_deep"),
        (b'{"model":"m","x":' + b"[" * 100 + b"]" * 100 + b"}", "json_too_deep"),
        (b"[" * 1_000_000, "json_too_many_nodes"),  # refused before parsing, by the node count
        (b"[" * 50_000, "json_too_deep"),
    ],
    ids=lambda v: v[:40].decode("latin-1") if isinstance(v, bytes) else str(v),
)
def test_bad_bodies(raw: bytes, code: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(None, raw=raw)
    assert info.value.code == code
    assert info.value.status_code == 400


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [1]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"stream": "yes"}, "stream"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"n": 9}, "n"),
        ({"best_of": 100}, "best_of"),
        ({"model": 5}, "model"),
        ({"model": "x" * 10_000}, "model"),
        ({"model": "a\nb"}, "model"),
        ({"messages": [{"role": "user", "content": ""}] * 101}, "messages"),
        ({"tools": {}}, "tools"),
    ],
)
def test_wrong_types_name_the_field(patch: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse({**OK, **patch})
    assert info.value.param == param


def test_huge_float_max_tokens_is_rejected() -> None:
    with pytest.raises(InvalidRequest):
        parse(None, raw=b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e309}')


def test_steering_fields_are_dropped() -> None:
    req = parse({**OK, "api_base": "http://evil", "base_url": "http://evil", "api_key": "k"})
    sent = json.loads(CHAT.encode(req, CHAT.base_edits(req), None, CHAT.target(req, "vllm")))
    assert "api_base" not in sent and "base_url" not in sent and "api_key" not in sent
    assert sent["messages"] == OK["messages"]
    assert "api_base" in req.body  # the parsed request itself is never changed


def test_completions_and_embeddings() -> None:
    assert parse({"model": "m", "prompt": "hi"}, kind="completions").api == "completions"
    with pytest.raises(InvalidRequest):
        parse({"model": "m", "prompt": 5}, kind="completions")
    with pytest.raises(InvalidRequest):
        parse({"model": "m"}, kind="embeddings")
    with pytest.raises(InvalidRequest):
        parse({"model": "m", "input": "x", "stream": True}, kind="embeddings")


AMPLIFIER = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[' + b",".join([b"{}"] * 3_400_000) + b"]}"


def test_json_amplification_is_refused_before_parsing() -> None:
    """docs/reliability.md defect 4: 3.4 million `{}` in an ignored field of a 10 MiB body cost ~500 MB to parse."""
    assert len(AMPLIFIER) < 10 * 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest) as info:
            parse(None, raw=AMPLIFIER)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code == "json_too_many_nodes" and info.value.status_code == 400
    assert peak < 3 * len(AMPLIFIER), peak  # a copy or two of the body, not 50 bytes a node


def test_many_scalars_are_bounded_too() -> None:
    raw = b'{"model":"m","prompt":[' + b",".join([b"1"] * 1_000_001) + b"]}"
    with pytest.raises(InvalidRequest) as info:
        parse_request("completions", raw, max_depth=64, max_n=8, max_messages=100)
    assert info.value.code == "json_too_many_nodes"
    ids = json.dumps({"model": "m", "prompt": list(range(200_000))}).encode()  # a long prompt as token ids
    assert len(parse_request("completions", ids, max_depth=64, max_n=8, max_messages=100).body["prompt"]) == 200_000


def test_commas_and_brackets_inside_strings_are_not_nodes() -> None:
    text = "a, b, [c], {d}, " * 150_000  # 600,000 commas and 300,000 brackets, all inside one string
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    assert parse(None, raw=raw).messages == [{"role": "user", "content": text}]
    escaped = json.dumps({"model": "m", "messages": [{"role": "user", "content": '\\", [' * 200_000}]})
    assert parse(None, raw=escaped.encode()).messages is not None


def test_every_engines_length_field_is_read_and_rewritten() -> None:
    """docs/reliability.md defect 6: the caps see the largest output length in any engine's field,
    and a max_tokens edit writes every field the client set."""
    from gateway.protocols.edits import Edits, apply_edits

    msgs = [{"role": "user", "content": "hi"}]
    inbound = parse({"model": "m", "messages": msgs, "max_tokens": 4, "n_predict": 50, "max_new_tokens": 9})
    assert inbound.max_tokens == 50
    assert set(inbound.length_fields) == {"max_tokens", "n_predict", "max_new_tokens"}
    out = json.loads(
        apply_edits(inbound.body, Edits(max_tokens=8), inbound.max_tokens_field, None, inbound.length_fields)
    )
    assert out["max_tokens"] == out["n_predict"] == out["max_new_tokens"] == 8
    unbounded = parse({"model": "m", "messages": msgs, "n_predict": -1})
    assert unbounded.max_tokens is None and unbounded.length_fields == ("n_predict",)
    for bad in ({"n_predict": -7}, {"max_new_tokens": 0}, {"num_predict": "x"}, {"max_completion_tokens": -1}):
        with pytest.raises(InvalidRequest):
            parse({"model": "m", "messages": msgs, **bad})
