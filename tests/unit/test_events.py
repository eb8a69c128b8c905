"""The event splitter and the observers built on it: a read costs what it brings, whatever the
event's size (counted in bytes searched, not timed), boundaries split across reads, and the size
limit."""

from __future__ import annotations

import json

import pytest

from gateway.config import LimitsConfig
from gateway.protocols.events import DEFAULT_MAX_EVENT_BYTES, LONG, EventSplitter, EventTooLarge
from gateway.protocols.frames import DataFrames
from gateway.protocols.native_observers import NativeObserver
from gateway.protocols.sse import StreamObserver

pytestmark = pytest.mark.unit


def _chat(text: str, usage: bool = False) -> bytes:
    event: dict[str, object] = {"choices": [{"index": 0, "delta": {"content": text}}]}
    if usage:
        event["usage"] = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("keep", [True, False])
def test_a_growing_event_is_searched_once(keep: bool) -> None:
    """4 MB in 1 KiB reads: every byte searched once (the old carry re-searched ~8 GB)."""
    event = _chat("x" * (4 << 20))
    split = EventSplitter(limit=8 << 20, keep=keep)
    out = b"".join(split.feed(r) + split.passed for r in _reads(event, 1024))
    assert split.scanned == len(event)
    assert out == event


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("crlf", [False, True])
def test_boundaries_split_across_reads(size: int, crlf: bool) -> None:
    events = _chat("a") + b": ping\n\n" + _chat("é b") + b"data: [DONE]\n\n"
    wire = events.replace(b"\n", b"\r\n") if crlf else events
    split = EventSplitter()
    out = b"".join(split.feed(r) for r in _reads(wire, size))
    assert out == events and split.flush() == b""


def test_an_event_past_the_limit_is_refused_as_it_grows() -> None:
    split = EventSplitter(limit=10_000, keep=False)
    with pytest.raises(EventTooLarge):
        for r in _reads(_chat("x" * 20_000), 1000):
            split.feed(r)
    assert split.scanned <= 11_000  # refused when the limit passed, not at the event's end


def test_the_limit_holds_for_events_inside_one_read() -> None:
    split = EventSplitter(limit=10_000)
    assert split.feed(_chat("x" * 9_000)) != b""
    with pytest.raises(EventTooLarge):
        split.feed(_chat("a") + _chat("x" * 10_001) + _chat("b"))
    with pytest.raises(EventTooLarge):
        EventSplitter(limit=10_000).feed(b"data: " + b"x" * 10_000 + b'"\n\ndata: [DONE]\n\n')


def test_a_long_event_is_not_held_when_relayed() -> None:
    """keep=False: past LONG the bytes go out as they come, and only head and tail stay."""
    event = _chat("x" * (1 << 20), usage=True)
    split = EventSplitter(keep=False)
    passed = 0
    for r in _reads(event, 4096):
        assert split.feed(r) == b""
        passed += len(split.passed)
        assert sum(len(p) for p in split._parts) <= 2 * LONG + 4096
    assert passed == len(event) and split.ended is not None and len(split.ended) <= 2 * LONG


@pytest.mark.parametrize("strip", [False, True])
def test_the_observer_counts_a_long_event_and_its_usage(strip: bool) -> None:
    stream = _chat("a") + _chat("x" * (3 << 20), usage=True) + b"data: [DONE]\n\n"
    obs = StreamObserver(strip_usage=strip)
    obs.limit_events(8 << 20)  # a long event, not the default limit, is what this reads
    out = b"".join(obs.feed(r, float(i)) for i, r in enumerate(_reads(stream, 65536))) + obs.flush()
    assert out == stream
    assert obs.content_events == 2 and obs.done
    assert obs.usage == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_the_observer_keeps_a_long_event_whole_for_a_translator() -> None:
    stream = _chat("x" * (1 << 20)) + b"data: [DONE]\n\n"
    obs = StreamObserver(strip_usage=False, whole_events=True)
    outs = [obs.feed(r, 0.0) for r in _reads(stream, 65536)]
    assert [o for o in outs if o] == [stream]  # one read: the whole event and [DONE]
    frames = DataFrames()
    assert len(frames.feed(stream)) == 2


def test_the_observer_raises_past_its_limit() -> None:
    obs = StreamObserver(strip_usage=True)
    obs.limit_events(100_000)
    with pytest.raises(EventTooLarge):
        for r in _reads(_chat("x" * 200_000), 65536):
            obs.feed(r, 0.0)


def test_the_native_observer_reads_a_long_final_event() -> None:
    text = "x" * (2 << 20)
    done = {
        "type": "response.completed",
        "response": {"output": [{"text": text}], "usage": {"input_tokens": 4, "output_tokens": 9}},
    }
    stream = (
        b'event: response.output_text.delta\ndata: {"delta":"'
        + text.encode()
        + b'"}\n\n'
        + b"event: response.completed\ndata: "
        + json.dumps(done).encode()
        + b"\n\n"
    )
    obs = NativeObserver.responses()
    obs.limit_events(4 << 20)
    for r in _reads(stream, 65536):
        assert obs.feed(r, 1.0) == r
    assert obs.content_events == 1 and obs.done
    assert obs.usage == {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    assert obs._split.scanned == len(stream)


def test_the_configured_default_is_the_scanners_default() -> None:
    # gateway/config/ imports nothing from the gateway, so it spells the number itself.
    assert LimitsConfig().max_event_bytes == DEFAULT_MAX_EVENT_BYTES
