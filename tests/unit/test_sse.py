"""The stream observer: exact accounting at any split, and byte-identical relay."""

from __future__ import annotations

import json

import pytest

from gateway.protocols.sse import StreamObserver

pytestmark = pytest.mark.unit


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def chunk(text: str) -> bytes:
    return event({"id": "c", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


ROLE = event({"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
USAGE = event({"id": "c", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + chunk("hé") + chunk("llo") + chunk(" wörld") + USAGE + DONE


def feed_split(observer: StreamObserver, data: bytes, size: int) -> bytes:
    out = b""
    for i in range(0, len(data), size):
        out += observer.feed(data[i : i + size], float(i))
    return out + observer.flush()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
def test_pass_through_is_byte_identical_at_any_split(size: int) -> None:
    obs = StreamObserver(strip_usage=False)
    assert feed_split(obs, STREAM, size) == STREAM
    assert obs.done and obs.content_events == 3
    assert obs.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert obs.first_token_at is not None


def test_gaps_are_between_reads_that_carry_content() -> None:
    obs = StreamObserver(strip_usage=False)
    for i, part in enumerate((ROLE, chunk("a"), chunk("b"), chunk("c") + USAGE + DONE)):
        obs.feed(part, float(i))
    assert obs.first_token_at == 1.0 and obs.last_token_at == 3.0 and obs.gaps == [1.0, 1.0]
    assert obs.together == 0
    together = StreamObserver(strip_usage=False)
    together.feed(STREAM, 5.0)  # one read of three content events: they came 0 s apart
    assert together.content_events == 3 and together.gaps == [] and together.first_token_at == 5.0
    assert together.together == 2
    together.feed(chunk("d") + chunk("e"), 7.0)  # one measured gap, then one more 0 s apart
    assert together.gaps == [2.0] and together.together == 3 and together.content_events == 5


def test_a_read_of_many_events_counts_only_content_events() -> None:
    finish = event({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    empty = event({"id": "c", "choices": [{"index": 0, "delta": {"content": ""}}]})
    null = event({"id": "c", "choices": [{"index": 0, "delta": {"content": None}}]})
    tool = event({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]})
    reasoning = event({"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]})
    tricky = chunk('say "content":"x" and data: [DONE]')  # markers inside a value are escaped
    obs = StreamObserver(strip_usage=False)
    obs.feed(ROLE + empty + null + chunk("a") + tool + reasoning + tricky + finish + USAGE, 1.0)
    assert obs.content_events == 4 and not obs.done
    obs.feed(DONE, 2.0)
    assert obs.done


def test_usage_on_a_content_event_is_read_and_relayed() -> None:
    last = event({"choices": [{"index": 0, "delta": {"content": "z"}}], "usage": {"completion_tokens": 2}})
    obs = StreamObserver(strip_usage=True)
    assert obs.feed(chunk("a") + last + DONE, 1.0) == chunk("a") + last + DONE
    assert obs.usage == {"completion_tokens": 2} and obs.content_events == 2


def test_strip_mode_drops_the_usage_event_wherever_it_falls_in_a_read() -> None:
    obs = StreamObserver(strip_usage=True)
    assert obs.feed(USAGE + DONE, 1.0) == DONE
    assert obs.usage is not None and obs.usage["prompt_tokens"] == 7


@pytest.mark.parametrize("size", [1, 5, 10_000])
def test_strip_mode_drops_only_the_injected_usage_event(size: int) -> None:
    obs = StreamObserver(strip_usage=True)
    out = feed_split(obs, STREAM, size)
    assert out == ROLE + chunk("hé") + chunk("llo") + chunk(" wörld") + DONE
    assert obs.usage is not None and obs.usage["completion_tokens"] == 3


def test_role_only_chunk_is_not_the_first_token() -> None:
    obs = StreamObserver(strip_usage=False)
    obs.feed(ROLE, 1.0)
    assert obs.first_token_at is None
    obs.feed(chunk("a"), 2.0)
    assert obs.first_token_at == 2.0


def test_usage_on_every_event_is_read_from_the_last() -> None:
    """vLLM's continuous usage stats put usage on each event: the stream's is the last one's."""

    def counted(text: str, tokens: int) -> bytes:
        body = {"choices": [{"index": 0, "delta": {"content": text}}], "usage": {"completion_tokens": tokens}}
        return event(body)

    obs = StreamObserver(strip_usage=False)
    obs.feed(b"".join(counted(c, i + 1) for i, c in enumerate("abcdef")), 1.0)
    assert obs.usage == {"completion_tokens": 6} and obs.content_events == 6
    obs.feed(counted("g", 7) + DONE, 2.0)
    assert obs.usage == {"completion_tokens": 7} and obs.done


def test_a_chat_observer_counts_no_text_and_a_completions_one_no_content() -> None:
    """The markers are the protocol's: a chat stream's `text` fields (inside tool arguments, say)
    are not content events, nor a completions stream's `content` fields."""
    text = event({"choices": [{"text": "x", "index": 0}]})
    chat, completions = StreamObserver(strip_usage=False), StreamObserver(strip_usage=False, text=True)
    chat.feed(text + chunk("a"), 1.0)
    completions.feed(text + chunk("a"), 1.0)
    assert chat.content_events == 1 and completions.content_events == 1


def test_tool_call_deltas_count_only_when_the_request_offered_tools() -> None:
    """Without tools an engine sends no tool calls: that byte pass is skipped."""
    tool = event({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]})
    with_tools, without = StreamObserver(strip_usage=False), StreamObserver(strip_usage=False, tools=False)
    with_tools.feed(tool + chunk("a"), 1.0)
    without.feed(tool + chunk("a"), 1.0)
    assert with_tools.content_events == 2 and without.content_events == 1


def test_completions_text_and_crlf() -> None:
    obs = StreamObserver(strip_usage=False, text=True)
    data = event({"choices": [{"text": "x", "index": 0}]}).replace(b"\n\n", b"\r\n\r\n") + b"data: [DONE]\r\n\r\n"
    assert obs.feed(data, 1.0) == data
    assert obs.content_events == 1 and obs.done


def test_first_event_error_is_seen() -> None:
    obs = StreamObserver(strip_usage=False)
    obs.feed(event({"error": {"message": "boom", "code": 400}}), 1.0)
    assert obs.error == {"error": {"message": "boom", "code": 400}}


def test_an_error_later_in_the_first_read_is_not_the_leading_error() -> None:
    """Only the stream's first event can be its leading error; an "error" word in a later event of the
    same read (a content event quoting it) is content."""
    obs = StreamObserver(strip_usage=False)
    obs.feed(chunk("a") + event({"error": {"message": "late"}}), 1.0)
    assert obs.error is None and obs.content_events == 1


def test_stream_without_done_is_not_done() -> None:
    obs = StreamObserver(strip_usage=False)
    obs.feed(ROLE + chunk("a"), 1.0)
    assert not obs.done


def test_pings_are_not_events() -> None:
    obs = StreamObserver(strip_usage=False)
    obs.feed(b": ping\n\n", 1.0)
    assert not obs.seen and obs.first_token_at is None
    obs.feed(chunk("a"), 2.0)
    assert obs.seen and obs.content_events == 1


def test_whole_events_mode_keeps_every_event_and_cuts_none() -> None:
    """For a protocol that translates the stream event by event: whole events only, none dropped."""
    obs = StreamObserver(strip_usage=False, whole_events=True)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    stream = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n' + usage + b"data: [DONE]\n\n"
    out = [obs.feed(stream[i : i + 7], float(i)) for i in range(0, len(stream), 7)]
    assert b"".join(out) + obs.flush() == stream
    assert all(piece == b"" or piece.endswith(b"\n\n") for piece in out)
    assert obs.done and obs.usage == {"prompt_tokens": 3, "completion_tokens": 1} and obs.content_events == 1


def test_a_crlf_stream_whose_first_read_ends_before_its_first_line_end() -> None:
    """The line ending is decided on the first read that holds one, not on a first read cut short."""
    data = (chunk("a") + chunk("b") + DONE).replace(b"\n", b"\r\n")
    obs = StreamObserver(strip_usage=False, whole_events=True)
    out = obs.feed(data[:10], 1.0) + obs.feed(data[10:], 2.0) + obs.flush()
    assert obs.done and obs.content_events == 2 and out.count(b"data: ") == 3


def test_usage_is_found_when_a_comment_stands_between_it_and_done() -> None:
    obs = StreamObserver(strip_usage=True)
    out = obs.feed(ROLE + chunk("a") + USAGE + b": ping\n\n" + DONE, 1.0)
    assert obs.done and obs.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert b'"usage"' not in out  # the injected usage event is still dropped
