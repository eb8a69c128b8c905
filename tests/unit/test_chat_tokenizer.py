"""A model's tokenizer and chat template loaded from its files: the template rendered as transformers
renders it, the text encoded without added special tokens for a chat and with them for a prompt,
the shapes left to the engine declined, and unreadable files refused at load. The model files are
made here: a word-level tokenizer over a small vocabulary, with a BOS post-processor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.pipeline.chat_tokenizer import ChatTokenizer
from tests.unit.model_files import ids_of, write_model

pytestmark = pytest.mark.unit

TURN = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "which rake?"}]


def test_a_chat_is_rendered_by_its_template_and_encoded_without_added_specials(tmp_path: Path) -> None:
    tok = ChatTokenizer.load(str(write_model(tmp_path)))
    body = {"model": "m", "messages": TURN, "max_tokens": 5, "stream": True}
    text = tok.chat_text(body)
    # bos_token comes from the config's AddedToken mapping; the generation prompt is added.
    assert (
        text
        == "<s><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwhich rake?<|im_end|>\n<|im_start|>assistant\n"
    )
    expected = ids_of("<s>", "<|im_start|>", "system", "\n", "be", "brief", "<|im_end|>", "\n")
    expected += ids_of(
        "<|im_start|>", "user", "\n", "which", "rake", "?", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"
    )
    # One BOS, the template's: the post-processor's would be a second one.
    assert tok.ids(body) == expected


NEXT = [*TURN, {"role": "assistant", "content": "be brief"}, {"role": "user", "content": "which rake?"}]


def test_a_next_turn_is_encoded_from_the_earlier_turns_cut(tmp_path: Path) -> None:
    tok = ChatTokenizer.load(str(write_model(tmp_path)))
    first = tok.chat_text({"messages": TURN})
    second = tok.chat_text({"messages": NEXT})
    assert first is not None and second is not None
    ids, cut = tok.encode_chat(first)
    assert cut is not None
    # The cut ends at the earlier prompt's last special token: the generation prompt's turn start.
    assert first[: cut.chars].endswith("<|im_start|>") and ids[cut.tokens - 1] == ids_of("<|im_start|>")[0]
    resumed = tok.resume(second, ids, cut)
    assert resumed is not None
    assert resumed == tok.encode_chat(second)  # the ids and the new cut of the whole text
    # A text that does not start as the earlier one did up to the cut is not resumed.
    assert tok.resume(second.replace("be brief", "be rake", 1), ids, cut) is None
    assert tok.resume(first[:5], ids, cut) is None


def test_a_chat_encoded_in_pieces_has_the_whole_texts_ids_and_each_piece_is_encoded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = ChatTokenizer.load(str(write_model(tmp_path)))
    first = tok.chat_text({"messages": TURN})
    second = tok.chat_text({"messages": [TURN[0], {"role": "user", "content": "which brief rake?"}]})
    assert first is not None and second is not None
    encoded: list[str] = []
    encode = ChatTokenizer.encode

    def counting(self: ChatTokenizer, text: str, special: bool, release: bool = False) -> list[int]:
        encoded.append(text)
        return encode(self, text, special, release)

    monkeypatch.setattr(ChatTokenizer, "encode", counting)
    assert tok.encode_chat(first, pieces=True) == tok.encode_chat(first)
    encoded.clear()
    # Another conversation with the same system prompt: only its own message is encoded.
    assert tok.pieced(second) == tok.encode(second, False)
    assert encoded[:-1] == ["user\nwhich brief rake?<|im_end|>"]  # the last: the whole text, above
    # A resumed turn takes its pieces from the cache too.
    ids, cut = tok.encode_chat(first)
    assert cut is not None
    encoded.clear()
    assert tok.resume(second, ids, cut, pieces=True) is None  # not the same conversation
    following = tok.chat_text({"messages": NEXT})
    assert following is not None
    assert tok.resume(following, ids, cut, pieces=True) == tok.encode_chat(following)


def test_the_pieces_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.pipeline.chat_tokenizer.PIECE_CHARS", 40)
    tok = ChatTokenizer.load(str(write_model(tmp_path)))
    for word in ("which", "rake", "brief"):
        text = tok.chat_text({"messages": [{"role": "user", "content": f"{word} {word} {word}"}]})
        assert text is not None
        assert tok.pieced(text) == tok.encode(text, False)
    assert 0 < tok._piece_chars <= 40
    assert sum(map(len, tok._pieces)) == tok._piece_chars


def test_a_text_without_special_tokens_has_no_cut(tmp_path: Path) -> None:
    tok = ChatTokenizer.load(str(write_model(tmp_path, template="{{ messages[0]['content'] }}")))
    assert tok.encode_chat("which rake?") == (ids_of("which", "rake", "?"), None)


def test_a_plain_prompt_gets_the_tokenizers_own_specials(tmp_path: Path) -> None:
    tok = ChatTokenizer.load(str(write_model(tmp_path)))
    assert tok.ids({"prompt": "which rake?"}) == ids_of("<s>", "which", "rake", "?")
    assert tok.ids({"prompt": ["which"]}) is None  # a list of prompts is the engine's to tokenize


@pytest.mark.parametrize(
    "body",
    [
        {"messages": TURN, "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"messages": TURN, "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": TURN, "add_generation_prompt": False},
        {"messages": TURN, "continue_final_message": True},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "which rake?"}]}]},
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
        {"messages": [{"role": "user", "content": "x", "reasoning_content": "y"}]},
        {"messages": []},
        {"messages": ["which rake?"]},
        {"prompt": "which", "add_special_tokens": False},
    ],
    ids=[
        "tools",
        "template-kwargs",
        "no-generation-prompt",
        "continue",
        "content-parts",
        "tool-calls",
        "other-key",
        "empty",
        "not-a-message",
        "prompt-specials-off",
    ],
)
def test_shapes_with_an_engine_side_step_are_left_to_the_engine(tmp_path: Path, body: dict[str, Any]) -> None:
    tok = ChatTokenizer.load(str(write_model(tmp_path)))
    assert tok.ids(body) is None


def test_the_template_gets_transformers_helpers(tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ {'q': m['content']} | tojson }}{% break %}"
        "{% endif %}{% endfor %}"
    )
    tok = ChatTokenizer.load(str(write_model(tmp_path, template=template)))
    # tojson does not HTML-escape (Jinja's own would write \u003c), and loop controls work.
    assert tok.chat_text({"messages": [*TURN, {"role": "user", "content": "<"}]}) == '{"q": "which rake?"}'
    assert tok.chat_text({"messages": [{"role": "user", "content": "<"}]}) is None  # raise_exception: the engine's


def test_the_template_file_and_named_templates(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ messages[0]['content'] }}"}]
    root = write_model(tmp_path, template=None, config={"chat_template": named})
    assert ChatTokenizer.load(str(root)).chat_text({"messages": TURN}) == "be brief"
    (root / "chat_template.jinja").write_text("{{ messages[1]['content'] }}")  # the file comes first
    assert ChatTokenizer.load(str(root)).chat_text({"messages": TURN}) == "which rake?"


def test_unreadable_model_files_are_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        ChatTokenizer.load(str(tmp_path))
    write_model(tmp_path, template=None)
    with pytest.raises(ValueError, match="no chat template"):
        ChatTokenizer.load(str(tmp_path))
    (tmp_path / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(ValueError, match="does not compile"):
        ChatTokenizer.load(str(tmp_path))
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        ChatTokenizer.load(str(tmp_path))
