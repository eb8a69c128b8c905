"""The client's model name back in a native answer, whole or in a stream cut at any byte."""

from __future__ import annotations

from gateway.protocols.rename import ModelRename

STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"model":"tiny","id":"m"}}\n\n'
    b'data: {"id":"c","model": "tiny","choices":[]}\n\n'
    b'data: {"model":"tiny-other","x":1}\n\n'
)
EXPECTED = STREAM.replace(b'"model":"tiny"', b'"model":"claude-opus-5-5"').replace(
    b'"model": "tiny"', b'"model": "claude-opus-5-5"'
)


def test_a_body_gets_the_clients_name_and_no_other_model_is_touched() -> None:
    out = ModelRename("tiny", "claude-opus-5-5").whole(STREAM)
    assert out == EXPECTED
    assert b'"model":"tiny-other"' in out


def test_a_stream_cut_at_every_byte_gets_the_same_bytes() -> None:
    for cut in range(1, len(STREAM)):
        rename = ModelRename("tiny", "claude-opus-5-5")
        out = rename.feed(STREAM[:cut]) + rename.feed(STREAM[cut:]) + rename.finish()
        assert out == EXPECTED, cut


def test_a_read_ending_in_an_event_is_passed_on_whole() -> None:
    rename = ModelRename("tiny", "c")
    assert rename.feed(b'data: {"model":"tiny"}\n\n') == b'data: {"model":"c"}\n\n'
    assert rename.finish() == b""
