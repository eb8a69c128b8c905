"""Canonical prompt text, chained block fingerprints, and the shared-prefix tracker."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.config import SharedPrefixConfig
from gateway.policy.prefix import PrefixTracker, canonical_prompt, fingerprint

pytestmark = pytest.mark.unit

B = 64  # block size used by most tests; small so that prompts stay small
CONFIG = SharedPrefixConfig(block_chars=B, min_prefix_chars=256, min_seen=2, window_s=600.0, max_entries=1024)
SYSTEM = "You are a careful coding agent. Follow the repository conventions exactly. " * 8
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}},
]


def fp_of(body: dict[str, Any], config: SharedPrefixConfig = CONFIG) -> tuple[int, ...]:
    return fingerprint(canonical_prompt(body), config.block_chars)


def chat(*messages: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}


# --- canonical_prompt -------------------------------------------------------------------------------


def test_system_then_tools_then_messages_in_order() -> None:
    body = chat(("user", "USER-1"), ("system", "SYS-1"), ("assistant", "ASSIST"), ("system", "SYS-2"))
    body["tools"] = TOOLS
    text = canonical_prompt(body)
    order = [text.index(s) for s in ("SYS-1", "SYS-2", "read_file", "USER-1", "ASSIST")]
    assert order == sorted(order)


def test_developer_role_counts_as_system() -> None:
    text = canonical_prompt(chat(("user", "U"), ("developer", "D")))
    assert text.index("D") < text.index("U")


def test_tools_are_canonical_json_whatever_the_key_order() -> None:
    a = {"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}
    b = {"function": {"parameters": {"b": 2, "a": 1}, "name": "f"}, "type": "function"}
    text_a = canonical_prompt(chat(("user", "hi"), tools=[a]))
    assert text_a == canonical_prompt(chat(("user", "hi"), tools=[b]))
    assert '{"function":{"name":"f","parameters":{"a":1,"b":2}},"type":"function"}' in text_a
    assert text_a != canonical_prompt(chat(("user", "hi")))


def test_text_parts_equal_plain_string_and_images_become_a_placeholder() -> None:
    parts = [{"type": "text", "text": "look at "}, {"type": "text", "text": "this"}]
    assert canonical_prompt(chat(("user", parts))) == canonical_prompt(chat(("user", "look at this")))
    with_image = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:AAAA"}}]
    other_image = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:BBBB"}}]
    text = canonical_prompt(chat(("user", with_image)))
    assert "AAAA" not in text and "[image]" in text
    assert text == canonical_prompt(chat(("user", other_image)))
    assert text != canonical_prompt(chat(("user", "look")))


def test_role_and_message_boundaries_are_part_of_the_text() -> None:
    one = canonical_prompt(chat(("user", "ab")))
    two = canonical_prompt(chat(("user", "a"), ("user", "b")))
    other_role = canonical_prompt(chat(("assistant", "ab")))
    assert len({one, two, other_role}) == 3


def test_assistant_tool_calls_are_part_of_the_text() -> None:
    call = [{"id": "1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]
    body = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": call},
        ]
    }
    assert "read_file" in canonical_prompt(body)


def test_next_turn_extends_the_previous_turn() -> None:
    turn1 = chat(("system", SYSTEM), ("user", "first question"), tools=TOOLS)
    turn2 = chat(("system", SYSTEM), ("user", "first question"), ("assistant", "answer"), ("user", "more"), tools=TOOLS)
    assert canonical_prompt(turn2).startswith(canonical_prompt(turn1))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": "plain completion"}, "plain completion"),
        ({"prompt": ["first", 7, "second"]}, "first\x1esecond"),
        ({"prompt": [1, 2, 3]}, ""),
        ({"prompt": 42}, ""),
        ({}, ""),
        ({"messages": "not a list", "prompt": "p"}, "p"),
    ],
)
def test_completions_prompt(body: dict[str, Any], expected: str) -> None:
    assert canonical_prompt(body) == expected


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [None, 3, "text"],
        [{"content": "no role"}],
        [{"role": 5, "content": "odd role"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": 12}],
        [{"role": "user", "content": [None, 1, {"type": 3}, {"type": "text", "text": None}, {"no": "type"}]}],
        [{"role": "user", "content": [{"type": "mystery", "data": "x"}]}],
        [{"role": "assistant", "tool_calls": {1: object()}}],
    ],
)
def test_odd_but_valid_shapes_do_not_raise(messages: list[Any]) -> None:
    text = canonical_prompt({"messages": messages, "tools": {"k": {1, 2}}})
    assert isinstance(text, str)
    for junk in ("mystery", "object", "None"):
        assert junk not in text


def test_unknown_parts_contribute_nothing() -> None:
    plain = canonical_prompt(chat(("user", [{"type": "text", "text": "hi"}])))
    odd = canonical_prompt(chat(("user", [{"type": "text", "text": "hi"}, {"type": "mystery", "text": "X"}])))
    assert plain == odd


# --- fingerprint ------------------------------------------------------------------------------------


def test_fingerprint_is_the_documented_chain() -> None:
    text = "0123456789abcdef" * 10 + "tail"
    expected, digest = [], b""
    data = text.encode()
    for start in range(0, len(data) - 15, 16):
        digest = hashlib.blake2b(digest + data[start : start + 16], digest_size=8).digest()
        expected.append(int.from_bytes(digest, "big"))
    assert fingerprint(text, 16) == tuple(expected)
    assert len(expected) == 10  # the partial trailing block is not hashed


def test_fingerprint_golden_values_are_stable_across_processes_and_versions() -> None:
    # Replicas (and rolling upgrades) must agree: these values may never depend on PYTHONHASHSEED.
    fp = fingerprint("The quick brown fox jumps over the lazy dog. " * 4, 16)
    assert len(fp) == 11
    assert fp[:3] == (14621989991172441697, 14460790124783786799, 13871055454842051533)
    assert fp[-1] == 1723781682118131042


def test_equal_prefixes_give_equal_leading_hashes_and_then_diverge() -> None:
    common = "x" * (B * 5 + 10)
    a = fingerprint(common + "A" * B * 3, B)
    b = fingerprint(common + "B" * B * 3, B)
    assert a[:5] == b[:5]
    assert all(x != y for x, y in zip(a[5:], b[5:], strict=True))  # chained: once apart, always apart


def test_same_block_at_another_position_hashes_differently() -> None:
    fp = fingerprint("a" * B * 4, B)
    assert len(set(fp)) == 4


def test_blocks_are_utf8_bytes() -> None:
    assert len(fingerprint("é" * B, B)) == 2  # two bytes per char
    assert len(fingerprint("a" * (B - 1), B)) == 0


def test_lone_surrogates_do_not_raise() -> None:
    assert len(fingerprint("\ud800" * B, B)) == 3


# --- PrefixTracker ----------------------------------------------------------------------------------


def agent_request(turn: str) -> tuple[int, ...]:
    """The agent's fixed system prompt and tools, then a user turn that differs within its first block."""
    return fp_of(chat(("system", SYSTEM), ("user", f"{turn}: " + "details of the task " * 10), tools=TOOLS))


def test_agent_workload_becomes_shared_after_min_seen() -> None:
    for min_seen in (2, 3, 5):
        tracker = PrefixTracker(CONFIG.model_copy(update={"min_seen": min_seen}))
        verdicts = [tracker.observe(agent_request(f"task number {i}: do it"), float(i)) for i in range(8)]
        assert [v.shared for v in verdicts] == [i + 1 >= min_seen for i in range(8)]
        assert [v.seen for v in verdicts] == [min(i + 1, min_seen) for i in range(8)]
        assert {v.reason for v in verdicts[min_seen - 1 :]} == {"seen"}


def test_min_seen_one_marks_every_long_enough_prompt() -> None:
    tracker = PrefixTracker(CONFIG.model_copy(update={"min_seen": 1}))
    assert tracker.observe(agent_request("first"), 0.0).shared
    assert not tracker.observe(fp_of(chat(("user", "short"))), 0.0).shared


def test_one_off_chats_are_not_shared() -> None:
    tracker = PrefixTracker(CONFIG)
    for i in range(200):
        body = chat(("user", f"Conversation {i}: " + f"a fresh question number {i} about something. " * 12))
        verdict = tracker.observe(fp_of(body), float(i))
        assert not verdict.shared and verdict.reason is None and verdict.seen == 1


def test_short_prompts_are_never_shared_by_count() -> None:
    tracker = PrefixTracker(CONFIG)
    short = fp_of(chat(("user", "hello " * 20)))  # ~130 chars < min_prefix_chars
    assert 0 < len(short) < CONFIG.min_prefix_chars // B
    verdicts = [tracker.observe(short, float(i)) for i in range(5)]
    assert not any(v.shared for v in verdicts)


def test_multi_turn_continuation_counts() -> None:
    tracker = PrefixTracker(CONFIG.model_copy(update={"min_seen": 10}))  # so only continuation can count
    history: list[tuple[str, Any]] = [("user", "Please review this code: " + "def f(x): return x * 2\n" * 20)]
    first = fp_of(chat(*history))
    assert not tracker.observe(first, 0.0).shared
    history += [("assistant", "It doubles x."), ("user", "And what about negative numbers?")]
    second = fp_of(chat(*history))
    assert second[: len(first)] == first
    verdict = tracker.observe(second, 5.0)
    assert verdict.shared and verdict.reason == "continuation"
    assert verdict.continued_blocks == len(first)
    history += [("assistant", "Also doubled, " * 20), ("user", "Thanks!")]
    third = tracker.observe(fp_of(chat(*history)), 9.0)
    assert third.reason == "continuation" and third.continued_blocks == len(second)


def test_the_longest_earlier_request_is_reported() -> None:
    tracker = PrefixTracker(CONFIG.model_copy(update={"min_seen": 100}))
    full = fingerprint("".join(f"turn {i} says something long enough. " for i in range(100)), B)
    for k in (7, 19, 4, 12, 16, 9):  # earlier, shorter prompts of the same conversation
        tracker.observe(full[:k], float(k))
    assert tracker.observe(full, 30.0).continued_blocks == 19


def test_a_continuation_matches_at_the_same_block_index() -> None:
    tracker = PrefixTracker(CONFIG.model_copy(update={"min_seen": 100}))
    tracker.observe((11, 12, 13, 14, 15), 0.0)
    # The earlier request's last hash at another index is not a continuation of it.
    assert tracker.observe((21, 22, 23, 24, 25, 15, 26), 1.0).continued_blocks == 0
    assert tracker.observe((11, 12, 13, 14, 15, 16), 2.0).continued_blocks == 5


def test_continuation_of_a_short_conversation_is_not_shared() -> None:
    tracker = PrefixTracker(CONFIG)
    history: list[tuple[str, Any]] = [("user", "x" * (B * 2))]  # below min_prefix_chars
    tracker.observe(fp_of(chat(*history)), 0.0)
    history += [("assistant", "y" * (B * 4)), ("user", "z")]
    assert not tracker.observe(fp_of(chat(*history)), 1.0).shared


def test_a_different_conversation_with_a_common_opening_is_not_a_continuation() -> None:
    tracker = PrefixTracker(CONFIG)
    opening = "Summarise the following article. " * 10
    tracker.observe(fp_of(chat(("user", opening + "Article one. " * 20))), 0.0)
    verdict = tracker.observe(fp_of(chat(("user", opening + "Article two. " * 20))), 1.0)
    assert verdict.continued_blocks == 0 and verdict.reason == "seen"  # a shared opening, not a next turn


def test_counts_and_continuations_expire_after_the_window() -> None:
    tracker = PrefixTracker(CONFIG)
    tracker.observe(agent_request("one"), 0.0)
    late = tracker.observe(agent_request("two"), CONFIG.window_s + 1.0)
    assert not late.shared and late.seen == 1
    assert tracker.observe(agent_request("three"), CONFIG.window_s + 2.0).shared

    tracker = PrefixTracker(CONFIG)
    first = fp_of(chat(("user", "q" * B * 6)))
    tracker.observe(first, 0.0)
    longer = fp_of(chat(("user", "q" * B * 6), ("assistant", "a"), ("user", "b" * B)))
    assert not tracker.observe(longer, CONFIG.window_s + 1.0).shared


def test_a_continuation_must_extend_a_request_from_within_the_window() -> None:
    tracker = PrefixTracker(CONFIG.model_copy(update={"min_seen": 10}))
    lead = "L" * CONFIG.min_prefix_chars
    exact = fingerprint(lead, B)  # ends exactly at the leading blocks, so its last hash is also the lead key
    tracker.observe(exact, 0.0)
    # A later request on the same leading blocks keeps that entry alive, but not the first request's end.
    tracker.observe(fingerprint(lead + "x" * B * 3, B), 500.0)
    verdict = tracker.observe(fingerprint(lead + "y" * B * 3, B), 700.0)
    assert verdict.continued_blocks == 0 and not verdict.shared


def test_only_min_seen_observations_within_the_window_count() -> None:
    tracker = PrefixTracker(CONFIG.model_copy(update={"min_seen": 3, "window_s": 10.0}))
    times = [0.0, 5.0, 12.0, 13.0, 30.0, 31.0, 32.0]  # at 12, the one at 0 has left the window
    shared = [tracker.observe(agent_request(f"t{t}"), t).shared for t in times]
    assert shared == [False, False, False, True, False, False, True]


def test_memory_is_bounded_under_100k_distinct_prefixes() -> None:
    tracker = PrefixTracker(CONFIG)  # max_entries 1024; lead key is block 4, so every fp adds 2 entries
    for i in range(100_000):
        fp = (i, i + 1, i + 2, i + 3, 1_000_000 + i, 2_000_000 + i)
        tracker.observe(fp, 0.0)  # a constant clock: only the size bound can evict
        if i % 997 == 0:
            assert len(tracker) <= CONFIG.max_entries
    assert len(tracker) == CONFIG.max_entries


def test_expired_entries_are_dropped() -> None:
    tracker = PrefixTracker(CONFIG)
    for i in range(300):
        tracker.observe(agent_request(f"task {i}"), 0.0)
    assert len(tracker) > 100
    tracker.observe(agent_request("later"), CONFIG.window_s + 1.0)
    assert len(tracker) == 2


def test_a_hot_prefix_survives_a_flood_of_one_off_prompts() -> None:
    # Least-recently-used eviction: a prefix in use stays while one-off prompts churn the table.
    tracker = PrefixTracker(CONFIG.model_copy(update={"max_entries": 64}))
    hot: list[bool] = []
    for i in range(2000):
        if i % 20 == 0:
            hot.append(tracker.observe(agent_request(f"task {i}"), float(i) / 100).shared)
        else:
            tracker.observe((i, i + 7, i + 9, i + 11, i + 13), float(i) / 100)
    assert hot[0] is False and all(hot[1:])


def test_an_agent_session_header_is_the_session_key_in_order() -> None:
    from gateway.policy.prefix import session_key

    claude = {"x-claude-code-session-id": "cc-1", "session-id": "codex-1"}
    assert session_key(claude, "x-session-id", "body") == "cc-1"
    assert session_key({"session-id": "s", "thread-id": "t"}, "x-session-id", None) == "s"
    assert session_key({"conversation_id": "old"}, "x-session-id", None) == "old"
    assert session_key({"x-session-id": "mine", **claude}, "x-session-id", None) == "mine", "configured first"
    assert session_key({}, "x-session-id", "prompt-cache-key") == "prompt-cache-key"
    assert session_key({}, "x-session-id", None) is None


def test_claude_codes_billing_line_does_not_change_the_fingerprint() -> None:
    from gateway.protocols.messages_translate import messages_to_chat

    def view(cch: str) -> dict[str, Any]:
        system = [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332; cch={cch};"},
            {"type": "text", "text": "You are a Claude agent." * 50},
        ]
        body = {"model": "m", "max_tokens": 9, "system": system, "messages": [{"role": "user", "content": "hi"}]}
        return messages_to_chat(body)

    first, second = (fingerprint(canonical_prompt(view(c)), 64) for c in ("a1b2c", "f9e8d"))
    assert first == second and first
