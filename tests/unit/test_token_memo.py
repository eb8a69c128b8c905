"""The memo of prompts' token ids: keys chained over the messages, the longest remembered leading run
found, and the bound on the ids held."""

from __future__ import annotations

import pytest

from gateway.pipeline.token_memo import Cut, TokenMemo, message_keys, prompt_key, text_digest

pytestmark = pytest.mark.unit

TURN1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "which rake?"}]
TURN2 = [*TURN1, {"role": "assistant", "content": "the leaf rake"}, {"role": "user", "content": "and gravel?"}]


def test_a_conversations_keys_extend_its_earlier_turns_keys() -> None:
    one, two = message_keys("m", TURN1), message_keys("m", TURN2)
    assert len(one) == 2 and len(two) == 4 and two[:2] == one
    assert len(set(two)) == 4
    # The same messages under another model, or with a key order changed, by value.
    assert message_keys("other", TURN1)[0] != one[0]
    assert message_keys("m", [{"content": "be brief", "role": "system"}])[0] == one[0]
    assert message_keys("m", [{"role": "system", "content": "be brief!"}])[0] != one[0]
    assert prompt_key("m", "x") != prompt_key("m", "y") and prompt_key("m", "x") == prompt_key("m", "x")


@pytest.mark.parametrize(
    "other",
    [
        {"role": "system\x00b", "content": "e brief"},  # the role's end moved into the content
        {"role": "syste", "content": "mbe brief"},
        {"role": "system", "content": "be brief", "name": "x"},  # a field more: the JSON form
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "system", "content": None},
    ],
)
def test_messages_that_differ_have_different_keys(other: dict[str, object]) -> None:
    assert message_keys("m", [other])[0] != message_keys("m", TURN1[:1])[0]


def test_the_longest_remembered_leading_run_is_found() -> None:
    memo = TokenMemo()
    one, two = message_keys("m", TURN1), message_keys("m", TURN2)
    memo.put(one[-1], [5, 6, 7])
    assert memo.get(two[-1]) is None
    earlier = memo.longest(two[:-1])
    assert earlier is not None and list(earlier) == [5, 6, 7]
    memo.put(two[1 + 1], [5, 6, 7, 8])  # the run of three messages
    found = memo.longest(two[:-1])
    assert found is not None and list(found) == [5, 6, 7, 8]
    assert memo.longest(message_keys("m", [{"role": "user", "content": "new"}])) is None


def test_the_least_recently_used_go_first_past_the_bound() -> None:
    memo = TokenMemo(max_ids=10)
    memo.put(1, range(4))
    memo.put(2, range(4))
    assert memo.get(1) is not None  # a is now the more recent
    memo.put(3, range(4))
    assert memo.get(2) is None and memo.get(1) is not None and memo.get(3) is not None
    assert memo.held == 8 and len(memo) == 2
    memo.put(1, range(2))  # replaced, not added
    assert memo.held == 6
    memo.put(4, range(11))  # past the whole bound: not kept, nothing else dropped
    assert memo.get(4) is None and memo.held == 6
    memo.put(5, [1, -1])  # not a token id
    assert memo.get(5) is None


def test_a_cut_is_found_with_its_ids_and_goes_with_them() -> None:
    memo = TokenMemo(max_ids=10)
    one, two = message_keys("m", TURN1), message_keys("m", TURN2)
    cut = Cut(5, 2, text_digest("hello"))
    memo.put(one[0], [1, 2, 3], cut)
    memo.put(one[1], [1, 2, 3, 4])  # remembered without a cut (asked of an engine)
    found = memo.resumable(two[:-1])
    assert found is not None and list(found[0]) == [1, 2, 3] and found[1] == cut
    memo.put(one[0], [1, 2, 3])  # put again without one: the cut goes
    assert memo.resumable(two[:-1]) is None
    memo.put(one[0], [1, 2, 3], cut)
    memo.put(6, range(4))
    memo.put(7, range(4))  # past the bound: the least recent, one[0] with its cut, go first
    assert memo.get(one[0]) is None and memo.resumable(two[:-1]) is None
    memo.put(one[0], [1, 2, 3], cut)
    memo.clear()
    assert memo.resumable(two[:-1]) is None
